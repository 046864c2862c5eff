# A CUDA holder whose GPU fds are not where a reader of /proc/PID/fd looks.
#   leader_exit GB: a thread holds GB on GPU 0, then the main thread calls pthread_exit (the leader shows Z
#                   while the thread group lives on)
#   private GB:     the thread that opens CUDA first unshares its fd table (CLONE_FILES), so the GPU fds are
#                   in no table but its own
import ctypes, sys, threading, time

mode, gb = sys.argv[1], float(sys.argv[2])
libc = ctypes.CDLL(None, use_errno=True)
ready = threading.Event()


def hold():
    if mode == "private" and libc.unshare(0x400) != 0:
        print("UNSHARE FAILED", ctypes.get_errno(), flush=True)
        return
    import torch
    x = torch.empty(int(gb * 2**30), dtype=torch.uint8, device="cuda:0")
    x.fill_(1)
    torch.cuda.synchronize()
    print("READY", flush=True)
    ready.set()
    while True:
        time.sleep(3600)


threading.Thread(target=hold).start()
ready.wait()
if mode == "leader_exit":
    libc.pthread_exit(None)
while True:
    time.sleep(3600)
