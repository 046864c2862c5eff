"""A stand-in for an expert-parallel inference server: a launcher that spawns WORKERS PyTorch workers, worker i
on GPU i % GPUS. Each worker ramps its memory up in steps (weights, then a KV cache) and then works in a loop.
With --nccl (one GPU per worker) they form an NCCL group and all-reduce in a loop, which creates the
/dev/shm/nccl-* segments a real server leaves behind.

  python3 ep_launcher.py --workers 8 --gpus 8 --gb 40 --nccl      # an 8-GPU node
  python3 ep_launcher.py --workers 4 --gpus 1 --gb 8              # one GPU, several processes
  python3 ep_launcher.py --workers 4 --gpus 1 --gb 6 --steps 6 --step-s 1 --slow 2   # rank 2 loads at 1/4 pace
  python3 ep_launcher.py --workers 4 --gpus 1 --gb 6 --loader 1 --sidecar 0  # and their helpers

--loader R: worker R forks a data-loader once its GPU is open (the child inherits the device, NVML does not
list it). --sidecar G: the launcher starts a sidecar that opens /dev/nvidiaG (a KV-IPC helper), no CUDA.

The launcher prints `LAUNCHER <pid> WORKERS <pid,...>` and then `ALL READY` when every worker holds its memory.
"""
import argparse, os, subprocess, sys, time

def worker(rank, world, gpu, gb, nccl, ready_path, steps=4, step_s=0.5, slow=-1, loader=-1):
    import torch
    torch.cuda.set_device(gpu)
    torch.empty(1, device="cuda")
    if rank == loader:
        # A data-loader forked after the GPU is open: it inherits the device files, never touches CUDA.
        if os.fork() == 0:
            time.sleep(3600)
            os._exit(0)
    if nccl:
        import torch.distributed as dist
        dist.init_process_group("nccl", rank=rank, world_size=world, device_id=torch.device("cuda", gpu))
    chunks = []
    for _ in range(steps):  # the ramp a warm-up shows; the slow rank's at a quarter of the pace
        t = torch.empty(int(gb / steps * 2**30), dtype=torch.uint8, device="cuda")
        t.fill_(1)
        chunks.append(t)
        torch.cuda.synchronize()
        time.sleep(step_s * (4 if rank == slow else 1))
    open(ready_path, "w").close()
    a = torch.randn(2048, 2048, device="cuda")
    v = torch.ones(1 << 20, device="cuda")
    while True:
        a = (a @ a).clamp_(-1, 1)
        if nccl:
            import torch.distributed as dist
            dist.all_reduce(v)
        torch.cuda.synchronize()
        time.sleep(0.05)

def main():
    p = argparse.ArgumentParser()
    p.add_argument("--workers", type=int, default=8)
    p.add_argument("--gpus", type=int, default=8)
    p.add_argument("--gb", type=float, default=40)
    p.add_argument("--nccl", action="store_true")
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--step-s", type=float, default=0.5)
    p.add_argument("--slow", type=int, default=-1, help="this rank loads at a quarter of the pace")
    p.add_argument("--loader", type=int, default=-1, help="this rank forks a data-loader once its GPU is open")
    p.add_argument("--sidecar", type=int, default=-1, help="a sidecar opens /dev/nvidiaN")
    p.add_argument("--worker", type=int, default=-1, help=argparse.SUPPRESS)
    p.add_argument("--ready-dir", default="/tmp/ep_ready")
    a = p.parse_args()
    if a.worker >= 0:
        worker(a.worker, a.workers, a.worker % a.gpus, a.gb, a.nccl, os.path.join(a.ready_dir, str(a.worker)),
               a.steps, a.step_s, a.slow, a.loader)
        return
    os.makedirs(a.ready_dir, exist_ok=True)
    for f in os.listdir(a.ready_dir):
        os.unlink(os.path.join(a.ready_dir, f))
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT="29511")
    procs = [
        subprocess.Popen([sys.executable, __file__, "--worker", str(r), "--workers", str(a.workers), "--gpus", str(a.gpus),
                          "--gb", str(a.gb), "--ready-dir", a.ready_dir, "--steps", str(a.steps),
                          "--step-s", str(a.step_s), "--slow", str(a.slow), "--loader", str(a.loader)]
                         + (["--nccl"] if a.nccl else []), env=env)
        for r in range(a.workers)
    ]
    print(f"LAUNCHER {os.getpid()} WORKERS {','.join(str(p.pid) for p in procs)}", flush=True)
    if a.sidecar >= 0:
        side = subprocess.Popen([sys.executable, "-c", f"import time; f = open('/dev/nvidia{a.sidecar}'); time.sleep(3600)"])
        print(f"SIDECAR {side.pid}", flush=True)
    while len(os.listdir(a.ready_dir)) < a.workers:
        if any(p.poll() is not None for p in procs):
            print("A WORKER DIED", flush=True)
            sys.exit(1)
        time.sleep(0.2)
    print("ALL READY", flush=True)
    time.sleep(3600)

if __name__ == "__main__":
    main()
