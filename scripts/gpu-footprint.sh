#!/usr/bin/env bash
# The node's footprint on a real GPU host: `gpusweep serve` at a 1 s poll reading dcgm-exporter's counters
# (what a DaemonSet runs), scraped every 15 s as Prometheus would, beside `nvidia-smi --query-gpu=... -l 1` (the
# loop operators compare it with) and, where installed, dcgm-exporter. Each minute: resident memory and CPU of
# each over that minute. First the uncached `snapshot` path against nvidia-smi, side by side (so a run cut
# short still has it); with BEFORE=another build, that build's one-shot readings in the same alternation.
#   BIN=.gpu/gpusweep [BEFORE=.gpu/gpusweep-before] OUT=DIR MINUTES=8 [RUNS=30] scripts/gpu-footprint.sh
set -uo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-.gpu/gpusweep}; OUT=${OUT:-/tmp/footprint}; MIN=${MINUTES:-8}; BEFORE=${BEFORE:-}; RUNS=${RUNS:-30}
mkdir -p "$OUT"; L=$OUT/footprint.log
say() { echo "$*" | tee -a "$L"; }
D=$(mktemp -d)
export GPUSWEEP_CONFIG=$D/none.toml GPUSWEEP_SOCKET=$D/none.sock GPUSWEEP_AUDIT_LOG=$D/audit.jsonl
say "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1), $(nproc) cores"
say "== the uncached snapshot path (before the serve starts), $RUNS runs each, alternating"
python3 - "$BIN" "$RUNS" "$BEFORE" <<'PY' | tee -a "$L"
import statistics, subprocess, sys, time
bin, runs, before = sys.argv[1], int(sys.argv[2]), sys.argv[3]
cmds = {
    "gpusweep snapshot --json --no-serve": [bin, "snapshot", "--json", "--no-serve"],
    "gpusweep snapshot --json --no-serve --no-gauges": [bin, "snapshot", "--json", "--no-serve", "--no-gauges"],
    "nvidia-smi --query-gpu=memory.used": ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader"],
    "nvidia-smi --query-gpu=memory.used,utilization.gpu": ["nvidia-smi", "--query-gpu=memory.used,utilization.gpu", "--format=csv,noheader"],
    "nvidia-smi --query-gpu=memory.used,utilization.gpu,temperature.gpu,power.draw": ["nvidia-smi", "--query-gpu=memory.used,utilization.gpu,temperature.gpu,power.draw", "--format=csv,noheader"],
}
# What each reads alike: the verdict reads memory, processes and utilization (clean means idle); the full
# reading the gauges too.
alike = {
    "gpusweep snapshot --json --no-serve --no-gauges": "nvidia-smi --query-gpu=memory.used,utilization.gpu",
    "gpusweep snapshot --json --no-serve": "nvidia-smi --query-gpu=memory.used,utilization.gpu,temperature.gpu,power.draw",
}
if before:
    cmds["before: snapshot --json --no-serve"] = [before, "snapshot", "--json", "--no-serve"]
    cmds["before: snapshot --json --no-serve --no-gauges"] = [before, "snapshot", "--json", "--no-serve", "--no-gauges"]
    alike["before: snapshot --json --no-serve --no-gauges"] = alike["gpusweep snapshot --json --no-serve --no-gauges"]
    alike["before: snapshot --json --no-serve"] = alike["gpusweep snapshot --json --no-serve"]
t = {k: [] for k in cmds}
for _ in range(runs):
    for k, c in cmds.items():
        s = time.perf_counter(); subprocess.run(c, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL); t[k].append(time.perf_counter() - s)
base = statistics.median(t["nvidia-smi --query-gpu=memory.used"])
for k, v in t.items():
    m = statistics.median(v)
    same = f"  {m/statistics.median(t[alike[k]]):.2f}x nvidia-smi reading the same" if k in alike else ""
    print(f"{k:55s} median {m*1000:6.2f} ms  {m/base:.2f}x nvidia-smi memory.used{same}")
if before:
    for k in ("snapshot --json --no-serve", "snapshot --json --no-serve --no-gauges"):
        print(f"this build / before, {k}: {statistics.median(t['gpusweep ' + k]) / statistics.median(t['before: ' + k]):.3f}")
PY
# How many GPUs of a snapshot's JSON (standard input) say `xids`: a one-shot reading watches none, a serve does.
with_xids() { python3 -c 'import json,sys; print(sum(1 for h in json.load(sys.stdin)["hosts"] for g in h["gpus"] if g.get("xids") is not None))'; }
say "one-shot snapshot, GPUs with xids: $("$BIN" snapshot --json --no-serve | with_xids)"
"$BIN" serve --no-socket --listen 127.0.0.1:19401 --interval 1s 2>"$D/serve.err" &
S=$!
nvidia-smi --query-gpu=index,memory.used,utilization.gpu,temperature.gpu,power.draw --format=csv,noheader -l 1 >/dev/null &
N=$!
X=""
if command -v dcgm-exporter >/dev/null 2>&1; then dcgm-exporter -a 127.0.0.1:19400 >/dev/null 2>&1 & X=$!; fi
trap 'kill $S $N $X 2>/dev/null; rm -rf "$D"' EXIT
until curl -sf http://127.0.0.1:19401/healthz >/dev/null 2>&1; do sleep 0.2; done
say "serve, GPUs with xids (watched): $(curl -s http://127.0.0.1:19401/api/v1/snapshot | with_xids)"
[ -z "$X" ] && say "dcgm-exporter: not installed on this host (no network to fetch it): not compared"
( while sleep 15; do curl -s http://127.0.0.1:19401/metrics >/dev/null; [ -n "$X" ] && curl -s http://127.0.0.1:19400/metrics >/dev/null; done ) &
W=$!
trap 'kill $S $N $X $W 2>/dev/null; rm -rf "$D"' EXIT
# Where each one's resident memory is: by mapping (the binary, libnvidia-ml, anonymous), the largest first;
# after the first minute and at the end (a run cut short keeps the first).
mapping() {
  for p in $S $N; do
    say "resident by mapping, $(cat /proc/$p/comm 2>/dev/null) (kB): $(grep -E '^(Anonymous|Rss):' /proc/$p/smaps_rollup 2>/dev/null | tr -s ' ' | tr '\n' ' ')"
    awk '$0 ~ /^[0-9a-f]+-[0-9a-f]+ / {name = ($6 == "" ? "[anonymous]" : $6)} /^Rss:/ {r[name] += $2}
         END {for (n in r) if (r[n] >= 256) print "  " r[n], n}' "/proc/$p/smaps" 2>/dev/null | sort -rn | head -8 | tee -a "$L"
  done
}
tck=$(getconf CLK_TCK)
cpu() { awk '{print $14+$15}' "/proc/$1/stat" 2>/dev/null || echo 0; }
rss() { awk '/VmRSS/{printf "%.1f", $2/1024}' "/proc/$1/status" 2>/dev/null; }
declare -A prev
for p in $S $N $X; do prev[$p]=$(cpu "$p"); done
for m in $(seq 1 "$MIN"); do
  sleep 60
  line="minute $m:"
  for p in $S $N $X; do
    c=$(cpu "$p"); name=$(cat /proc/$p/comm 2>/dev/null)
    line="$line $name $(rss "$p") MB $(awk -v a="${prev[$p]}" -v b="$c" -v t="$tck" 'BEGIN{printf "%.2f%%", 100*(b-a)/t/60}');"
    prev[$p]=$c
  done
  say "$line"
  [ "$m" = 1 ] && mapping
done
kill $W 2>/dev/null
mapping
say "serve's metrics: $(curl -s http://127.0.0.1:19401/metrics | grep -vc '^#') samples"
kill $S $N $X 2>/dev/null; wait 2>/dev/null
