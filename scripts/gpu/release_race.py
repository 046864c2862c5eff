"""How soon a running `gpusweep serve` says a GPU is clean after its holder dies, against an NVML probe polling
every millisecond in the same run. Needs nvidia-ml-py (pynvml) and torch.

  python3 release_race.py http://127.0.0.1:PORT ROUNDS GB

Each round: a PyTorch process takes GB of GPU 0; once NVML shows it, it is SIGKILLed; the probe notes when
NVML first reads 0 used (the driver's release), the serve's event stream when it said `gpu_clean`. Prints one
JSON line per round and a summary line.
"""
import json, os, signal, subprocess, sys, threading, time, urllib.request

import pynvml

base, rounds, gb = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
here = os.path.dirname(os.path.abspath(__file__))
pynvml.nvmlInit()
dev = pynvml.nvmlDeviceGetHandleByIndex(0)


def used():
    # v2: used without the driver's reservation, as gpusweep reads it (an idle H200 reads 0).
    return pynvml.nvmlDeviceGetMemoryInfo(dev, version=pynvml.nvmlMemory_v2).used


def now_ms():
    return time.time() * 1000.0


clean_events = []
lock = threading.Lock()


def follow():
    with urllib.request.urlopen(base + "/api/v1/events") as r:
        kind = None
        for raw in r:
            line = raw.decode("utf-8", "replace").rstrip("\n")
            if line.startswith("event: "):
                kind = line[7:]
            elif line.startswith("data: ") and kind == "event":
                e = json.loads(line[6:])
                if e.get("event") == "gpu_clean" and e.get("gpu") == 0:
                    with lock:
                        clean_events.append((e["at_ms"], now_ms()))


threading.Thread(target=follow, daemon=True).start()
time.sleep(1.0)
out = []
for n in range(rounds):
    while used() != 0:
        time.sleep(0.01)
    with lock:
        seen = len(clean_events)
    h = subprocess.Popen([sys.executable, os.path.join(here, "hold.py"), str(gb)], stdout=subprocess.PIPE, text=True)
    line = h.stdout.readline()
    while used() < gb * 0.9 * 2**30:
        time.sleep(0.001)
    time.sleep(1.5)  # the serve has read it as held
    kill_ms = now_ms()
    os.kill(h.pid, signal.SIGKILL)
    release_ms = None
    while release_ms is None:
        if used() == 0:
            release_ms = now_ms()
        else:
            time.sleep(0.001)
    h.wait()
    deadline = time.time() + 10
    while time.time() < deadline:
        with lock:
            if len(clean_events) > seen:
                break
        time.sleep(0.001)
    with lock:
        ev = clean_events[seen] if len(clean_events) > seen else None
    r = {
        "round": n,
        "release_after_kill_ms": round(release_ms - kill_ms, 1),
        "serve_clean_at_minus_release_ms": round(ev[0] - release_ms, 1) if ev else None,
        "serve_event_received_minus_release_ms": round(ev[1] - release_ms, 1) if ev else None,
    }
    print(json.dumps(r), flush=True)
    out.append(r)
ok = [r["serve_clean_at_minus_release_ms"] for r in out if r["serve_clean_at_minus_release_ms"] is not None]
print(
    "SUMMARY rounds=%d released_after_kill_ms=%s serve_reading_minus_release_ms=%s within_10ms=%s"
    % (
        len(out),
        [r["release_after_kill_ms"] for r in out],
        ok,
        len(ok) == len(out) and all(abs(x) <= 10 for x in ok),
    ),
    flush=True,
)
