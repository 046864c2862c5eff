"""Run a command under a seccomp filter that answers ENOSYS to pidfd_open and pidfd_send_signal (x86_64),
as a 4.18 kernel would: python3 nopidfd.py CMD ARGS..."""
import ctypes, os, struct, sys

PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 38, 22, 2
LD_ABS_W, JEQ_K, RET_K = 0x20, 0x15, 0x06
def op(code, jt, jf, k): return struct.pack("HBBI", code, jt, jf, k)
prog = b"".join([
    op(LD_ABS_W, 0, 0, 4), op(JEQ_K, 0, 3, 0xC000003E),   # another ABI: allow
    op(LD_ABS_W, 0, 0, 0), op(JEQ_K, 2, 0, 434), op(JEQ_K, 1, 0, 424),
    op(RET_K, 0, 0, 0x7FFF0000), op(RET_K, 0, 0, 0x00050000 | 38),
])
buf = ctypes.create_string_buffer(prog)
class Fprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]
fp = Fprog(len(prog) // 8, ctypes.addressof(buf))
libc = ctypes.CDLL(None, use_errno=True)
if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) or libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(fp)):
    sys.exit("seccomp: %s" % os.strerror(ctypes.get_errno()))
os.execvp(sys.argv[1], sys.argv[1:])
