#!/usr/bin/env bash
# An EP-style job killed carelessly, swept and watched to zero.
#   8-GPU node:  WORKERS=8 GPUS=8 GB=40 NCCL=1 scripts/gpu-ep.sh
#   one GPU:     WORKERS=4 GPUS=1 GB=8 scripts/gpu-ep.sh        (several processes on one GPU, no NCCL)
# On a multi-GPU host keep NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1.
# Writes $OUT/ep.log: the warm-up ramp as gpusweep saw it, what it found after `kill -9 <launcher>`, what
# `nvidia-smi ... | head -2` showed, the sweep and the time from the first signal to all-zero, and the cost of
# one gpusweep snapshot against one nvidia-smi query of the same GPUs.
set -u
cd "$(dirname "$0")/.."
BIN=${BIN:-.gpu/gpusweep}
OUT=${OUT:-/tmp/gpusweep-ep}
WORKERS=${WORKERS:-8}; GPUS=${GPUS:-8}; GB=${GB:-40}; NCCL=${NCCL:-0}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export GPUSWEEP_CONFIG=${GPUSWEEP_CONFIG:-/nonexistent/gpusweep.toml}
source scripts/lib/gpu-log.sh ep
LP=""
cleanup() { [ -n "$LP" ] && kill -9 "$LP" 2>/dev/null; pkill -9 -f ep_launcher.py 2>/dev/null; rm -rf "$W"; }
trap cleanup EXIT

say "launch: $WORKERS workers on $GPUS GPU(s), $GB GB each, nccl=$NCCL ($(date -u +%FT%TZ))"
python3 scripts/gpu/ep_launcher.py --workers "$WORKERS" --gpus "$GPUS" --gb "$GB" $([ "$NCCL" = 1 ] && echo --nccl) >"$W/launcher.out" 2>&1 &
LP=$!
for i in $(seq 1 40); do
  sleep 1
  if [ $((i % 4)) = 0 ] || grep -q "ALL READY" "$W/launcher.out"; then
    say "warm-up +${i}s"; "$BIN" snapshot 2>&1 | sed -n '1,12p' >>"$L"
  fi
  grep -q "ALL READY" "$W/launcher.out" && break
done
grep -q "ALL READY" "$W/launcher.out" || { res "FAIL workers did not get ready"; cat "$W/launcher.out" >>"$L"; exit 1; }
WPIDS=$(sed -n 's/^LAUNCHER [0-9]* WORKERS //p' "$W/launcher.out")
ls -la /dev/shm >>"$L" 2>&1

say "kill -9 the launcher $LP only, as a careless pkill would"
kill -9 "$LP"; wait "$LP" 2>/dev/null; LP=""
sleep 1
say "what nvidia-smi --query-gpu=memory.used --format=csv,noheader | head -2 shows"
nvidia-smi --query-gpu=memory.used --format=csv,noheader | head -2 | tee -a "$L"
say "what gpusweep shows"
"$BIN" snapshot >>"$L" 2>&1
"$BIN" snapshot --json >"$W/ep.json" 2>>"$L"
python3 - "$W/ep.json" "$WPIDS" "$WORKERS" <<'PY' | tee -a "$L"
import json, sys
h = json.load(open(sys.argv[1]))["hosts"][0]
workers = [int(p) for p in sys.argv[2].split(",")]
orphans = {f["pid"] for f in h["findings"] if f["kind"] == "orphan"}
listed = {p["pid"]: p["used_bytes"] for g in h["gpus"] for p in g["processes"]}
found = [w for w in workers if w in orphans]
print(("PASS" if len(found) == int(sys.argv[3]) else "FAIL") + f" orphaned workers found: {len(found)} of {sys.argv[3]} ({found})")
print("NOTE memory held by the orphans: %.1f GiB" % (sum(listed.get(w, 0) or 0 for w in workers) / 2**30))
segs = [s["name"] for s in (h.get("shm") or {}).get("segments", [])]
print(f"NOTE /dev/shm GPU-stack segments seen: {segs}")
PY
rm -f "$W/ep.json"

say "sweep --yes, then wait"
"$BIN" sweep --yes --grace 10s --timeout 60s >"$W/ep-sweep.txt" 2>&1; rc=$?
cat "$W/ep-sweep.txt" >>"$L"
[ $rc = 0 ] && res "PASS sweep exit 0: $(grep -o 'clean: .*' "$W/ep-sweep.txt")" || res "FAIL sweep exit $rc"
"$BIN" wait --timeout 10s >>"$L" 2>&1 && res "PASS wait: every GPU reads zero" || res "FAIL wait"
nvidia-smi --query-gpu=index,memory.used --format=csv,noheader >>"$L"
rm -f "$W/ep-sweep.txt"

say "cost: one gpusweep snapshot of all GPUs vs one nvidia-smi query of all GPUs"
python3 - "$BIN" <<'PY' | tee -a "$L"
import statistics, subprocess, sys, time
def t(cmd, n=30):
    xs = []
    for _ in range(n):
        a = time.perf_counter(); subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL); xs.append((time.perf_counter() - a) * 1000)
    return statistics.median(xs)
g = t([sys.argv[1], "snapshot", "--json"]); n = t(["nvidia-smi", "--query-gpu=index,memory.used", "--format=csv,noheader"])
print(f"NOTE gpusweep snapshot --json (GPUs, processes, holders, findings): median {g:.1f} ms; nvidia-smi --query-gpu=index,memory.used: median {n:.1f} ms")
PY
