"""Keep GPU 0's tensor cores busy for SECONDS: `python3 matmul.py SECONDS`. Prints READY once running."""
import sys, time
import torch

secs = float(sys.argv[1]) if len(sys.argv) > 1 else 30
a = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda")
b = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda")
torch.cuda.synchronize()
print("READY", flush=True)
end = time.time() + secs
while time.time() < end:
    for _ in range(20):
        c = a @ b
    torch.cuda.synchronize()
