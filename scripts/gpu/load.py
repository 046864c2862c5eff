"""One process's load on GPU 0, for the hang scenes (scripts/gpu-hang.sh): it holds GB GiB, prints READY, then
does WHAT for SECONDS:
  spin    a one-thread kernel that waits (torch.cuda._sleep), over and over: what a rank in a collective runs
  matmul  a bf16 8192^3 matmul loop (a training step)
  copy    a 1 GiB device-to-device copy loop (memory-bound)
  idle    nothing (a settled server waiting for requests)
  pause   matmul for 30 s, the GPU idle for 120 s while the CPU works (a compile), then matmul again
  sleep   the process sleeps on the CPU (the rank the others wait for)
"""
import sys, time
import torch

what, seconds, gb = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
hold = torch.empty(int(gb * (1 << 30)), dtype=torch.uint8, device="cuda")
torch.cuda.synchronize()
print("READY", flush=True)
end = time.time() + seconds
a = b = x = y = None
if what in ("matmul", "pause"):
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
if what == "copy":
    x = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    y = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
start = time.time()
while time.time() < end:
    if what == "spin":
        torch.cuda._sleep(100_000_000)
        torch.cuda.synchronize()
    elif what == "matmul" or (what == "pause" and not 30 <= time.time() - start < 150):
        for _ in range(20):
            a @ b
        torch.cuda.synchronize()
    elif what == "copy":
        for _ in range(10):
            x.copy_(y)
        torch.cuda.synchronize()
    elif what == "pause":
        t = time.time() + 1
        while time.time() < t:
            pass
    else:
        time.sleep(1)
