"""The fork leak: allocate GB, fork a child that only sleeps (it inherits the CUDA context), then wait to be
SIGKILLed. NVML keeps charging the dead parent while the child keeps the memory alive.
Prints `PARENT <pid> CHILD <pid>`."""
import os, sys, time
import torch

gb = float(sys.argv[1]) if len(sys.argv) > 1 else 10
x = torch.empty(int(gb * 2**30), dtype=torch.uint8, device="cuda")
x.fill_(1)
torch.cuda.synchronize()
pid = os.fork()
if pid == 0:
    # The child never touches CUDA again; it only keeps the inherited descriptors open.
    time.sleep(3600)
    os._exit(0)
print(f"PARENT {os.getpid()} CHILD {pid}", flush=True)
time.sleep(3600)
