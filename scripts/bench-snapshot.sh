#!/usr/bin/env bash
# Whole-process cost of one `gpusweep snapshot --json` (and, where nvidia-smi exists, one nvidia-smi query),
# median over N runs.   scripts/bench-snapshot.sh [N]
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-40}
source scripts/lib/host.sh
python3 - "$BIN" "$N" <<'PY'
import shutil, statistics, subprocess, sys, time
def t(cmd, n):
    xs = []
    for _ in range(n):
        a = time.perf_counter(); subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL); xs.append((time.perf_counter() - a) * 1000)
    return statistics.median(xs), min(xs)
n = int(sys.argv[2])
print("gpusweep snapshot --json: median %.1f ms (min %.1f) over %d runs" % (*t([sys.argv[1], "snapshot", "--json"], n), n))
if shutil.which("nvidia-smi"):
    print("nvidia-smi --query-gpu=memory.used: median %.1f ms (min %.1f)" % t(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader"], n))
PY
