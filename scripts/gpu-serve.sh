#!/usr/bin/env bash
# `gpusweep serve` on a real GPU: what a whole `snapshot --json` process costs with and without a running serve,
# against one nvidia-smi query in the same run; how soon the serve says a GPU is clean after its holder dies,
# against an NVML probe polling every millisecond; and what `wait` and `serve` cost at a 100 ms poll on a node
# with 5,000 processes. Writes $OUT/serve.log.
#   BIN=.gpu/gpusweep OUT=/tmp/out scripts/gpu-serve.sh
set -u
cd "$(dirname "$0")/.."
BIN=${BIN:-.gpu/gpusweep}
BIN=$(realpath "$BIN")
OUT=${OUT:-/tmp/gpusweep-serve}
mkdir -p "$OUT"
L=$OUT/serve.log
: >"$L"
export PYTHONUNBUFFERED=1 GPUSWEEP_CONFIG=/nonexistent/gpusweep.toml GPUSWEEP_AUDIT_LOG=$OUT/actions.jsonl
export GPUSWEEP_SOCKET=/tmp/gpusweep-serve-$$.sock
say() { echo "== $* ($(date -u +%FT%TZ))" | tee -a "$L"; }
PIDS=()
trap 'for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done; rm -f "$GPUSWEEP_SOCKET"' EXIT

say "environment"
{ uname -r; nvidia-smi --query-gpu=name,driver_version,memory.used --format=csv,noheader; "$BIN" --version; echo "processes: $(ls /proc | grep -c '^[0-9]')"; } 2>&1 | tee -a "$L"

say "1. snapshots traced (where their time goes), and what each NVML call costs cold and warm"
for _ in 1 2 3; do GPUSWEEP_TRACE=1 "$BIN" snapshot --json --no-serve 2>&1 >/dev/null | tee -a "$L"; done
for _ in 1 2 3; do python3 scripts/gpu/nvml_cold.py 2>&1 | tee -a "$L"; done
for _ in 1 2; do for m in plain util-first parallel fields; do python3 scripts/gpu/nvml_order.py $m 2>&1 | tee -a "$L"; done; done

bench() { # N CMD...: whole processes, interleaved, medians; each CMD one string; ratios against the first nvidia-smi
python3 - "$BIN" "$@" <<'PY' 2>&1 | tee -a "$L"
import shlex, statistics, subprocess, sys, time
b, n, cmds = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
runs = {c: [b if w == "gpusweep" else w for w in shlex.split(c)] for c in cmds}
xs = {k: [] for k in runs}
for _ in range(n):
    for k, cmd in runs.items():
        a = time.perf_counter(); subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL); xs[k].append((time.perf_counter() - a) * 1000)
m = {k: statistics.median(v) for k, v in xs.items()}
base = next(k for k in cmds if k.startswith("nvidia-smi"))
for k, v in xs.items():
    print("%-92s median %6.2f ms  min %6.2f  max %6.2f  = %.2fx the first nvidia-smi" % (k, m[k], min(v), max(v), m[k] / m[base]))
print("(%d runs each, interleaved)" % n)
PY
}
SMI_MEM="nvidia-smi --query-gpu=memory.used --format=csv,noheader"
SMI_GAUGES="nvidia-smi --query-gpu=memory.used,utilization.gpu,temperature.gpu,power.draw --format=csv,noheader"
say "2. whole processes without a serve: the verdict alone (--no-gauges) against nvidia-smi reading memory, the full reading against nvidia-smi reading the same gauges"
bench 40 "$SMI_MEM" "gpusweep snapshot --json --no-serve --no-gauges" "gpusweep wait --timeout 0s --no-serve" "gpusweep snapshot --json --no-serve" "$SMI_GAUGES"
for _ in 1 2; do GPUSWEEP_TRACE=1 "$BIN" snapshot --json --no-serve --no-gauges 2>&1 >/dev/null | tee -a "$L"; done
say "3. the same with a serve running (snapshot reads it through its socket)"
"$BIN" serve --no-http --interval 1s 2>>"$L" & PIDS+=($!)
for _ in $(seq 1 100); do [ -S "$GPUSWEEP_SOCKET" ] && break; sleep 0.05; done
sleep 0.5
"$BIN" snapshot --json | python3 -c 'import json,sys; print("source:", json.load(sys.stdin)["hosts"][0]["source"])' | tee -a "$L"
GPUSWEEP_TRACE=1 "$BIN" snapshot --json 2>&1 >/dev/null | tee -a "$L"
bench 40 "$SMI_MEM" "gpusweep snapshot --json" "gpusweep wait --timeout 0s"
kill "${PIDS[-1]}"; wait "${PIDS[-1]}" 2>/dev/null

say "4. a holder's death to the serve's gpu_clean event, against NVML polled every 1 ms"
PORT=19401
"$BIN" serve --no-socket --listen 127.0.0.1:$PORT --interval 1s 2>>"$L" & SP=$!; PIDS+=($SP)
sleep 1
python3 scripts/gpu/release_race.py "http://127.0.0.1:$PORT" 5 20 2>&1 | tee -a "$L"
python3 -c "import urllib.request,sys; print(urllib.request.urlopen(sys.argv[1]).read().decode())" "http://127.0.0.1:$PORT/metrics" | grep -E '^gpusweep_time_to_clean_seconds_(count|sum)' | tee -a "$L"
kill "$SP"; wait "$SP" 2>/dev/null

say "5. wait and serve at a 100 ms poll with 5,000 processes, a GPU in use (hold.py 2 GB)"
python3 scripts/gpu/hold.py 2 >"$OUT/hold2.out" 2>&1 & HP=$!; PIDS+=($HP)
for _ in $(seq 1 300); do grep -q READY "$OUT/hold2.out" 2>/dev/null && break; sleep 0.1; done
REAL_GPU=1 BIN="$BIN" bash scripts/bench-busy-node.sh 5000 30 2>&1 | tee -a "$L"
CHURN=1 REAL_GPU=1 BIN="$BIN" bash scripts/bench-busy-node.sh 5000 30 2>&1 | tee -a "$L"
kill "$HP"; wait "$HP" 2>/dev/null
say "done"
