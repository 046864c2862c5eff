"""Hold GB of GPU memory: `python3 hold.py GB [SECONDS]`. Prints READY <pid> once the memory is touched."""
import os, sys, time
import torch

gb = float(sys.argv[1]) if len(sys.argv) > 1 else 20
secs = float(sys.argv[2]) if len(sys.argv) > 2 else 3600
x = torch.empty(int(gb * 2**30), dtype=torch.uint8, device="cuda")
x.fill_(1)
torch.cuda.synchronize()
print(f"READY {os.getpid()}", flush=True)
time.sleep(secs)
