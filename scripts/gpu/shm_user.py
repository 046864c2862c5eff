"""Map a /dev/shm segment and keep it mapped with the fd closed (as NCCL does): `shm_user.py NAME`."""
import mmap, os, sys, time

path = "/dev/shm/" + sys.argv[1]
fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
os.ftruncate(fd, 4 << 20)
m = mmap.mmap(fd, 4 << 20)
os.close(fd)
m[:4] = b"nccl"
print(f"READY {os.getpid()}", flush=True)
time.sleep(3600)
