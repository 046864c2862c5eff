#!/usr/bin/env bash
# dcgm-exporter's fields from `gpusweep serve` on a real GPU: every field read idle, then under a bf16 matmul
# (tensor activity, clocks, power, energy rising); and what the counters cost a poll against the verdict
# alone (the poll bench's Verdict / Gauges / Counters readings). Writes $OUT/dcgm.log.
#   BIN=.gpu/gpusweep BENCH=.gpu/poll-bench OUT=/tmp/out scripts/gpu-dcgm.sh
set -u
cd "$(dirname "$0")/.."
BIN=${BIN:-.gpu/gpusweep}
BENCH=${BENCH:-.gpu/poll-bench}
OUT=${OUT:-/tmp/gpusweep-dcgm}
mkdir -p "$OUT"
L=$OUT/dcgm.log
: >"$L"
export PYTHONUNBUFFERED=1 GPUSWEEP_CONFIG=/nonexistent/gpusweep.toml GPUSWEEP_AUDIT_LOG=$OUT/actions.jsonl
say() { echo "== $* ($(date -u +%FT%TZ))" | tee -a "$L"; }
PIDS=()
trap 'for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done' EXIT
"$BIN" serve --no-socket --listen 127.0.0.1:9471 --interval 1s 2>>"$L" & PIDS+=($!)
for _ in $(seq 50); do curl -sf 127.0.0.1:9471/healthz >/dev/null && break; sleep 0.2; done
fields() { curl -s 127.0.0.1:9471/metrics | grep -E '^DCGM_FI_' | grep 'gpu="0"' | sed -E 's/\{.*\}//' ; }
say "idle: GPU 0's fields"
sleep 3; fields | tee "$OUT/idle.txt" | tee -a "$L"
say "labels of one series"
curl -s 127.0.0.1:9471/metrics | grep -m1 '^DCGM_FI_DEV_SM_CLOCK' | tee -a "$L"
python3 scripts/gpu/matmul.py 25 >"$OUT/mm.out" 2>&1 & PIDS+=($!)
for _ in $(seq 300); do grep -q READY "$OUT/mm.out" && break; sleep 0.2; done
sleep 6
say "under a bf16 8192^3 matmul loop"
fields | tee "$OUT/busy.txt" | tee -a "$L"
sleep 5
fields > "$OUT/busy2.txt"
python3 - "$OUT" <<'PY' | tee -a "$L"
import sys
d = sys.argv[1]
def read(f):
    out = {}
    for line in open(f"{d}/{f}"):
        k, v = line.split()
        out[k] = float(v)
    return out
idle, busy, busy2 = read("idle.txt"), read("busy.txt"), read("busy2.txt")
want = ["DCGM_FI_DEV_SM_CLOCK", "DCGM_FI_DEV_MEM_CLOCK", "DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_POWER_USAGE",
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "DCGM_FI_DEV_GPU_UTIL",
        "DCGM_FI_DEV_MEM_COPY_UTIL", "DCGM_FI_DEV_ENC_UTIL", "DCGM_FI_DEV_DEC_UTIL",
        "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
        "DCGM_FI_DEV_ROW_REMAP_FAILURE", "DCGM_FI_DEV_MEMORY_TEMP", "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "DCGM_FI_PROF_DRAM_ACTIVE", "DCGM_FI_PROF_PCIE_TX_BYTES",
        "DCGM_FI_PROF_PCIE_RX_BYTES", "DCGM_FI_DEV_FB_USED"]
for k in want:
    print(("PASS" if k in busy else "ABSENT"), k, "idle", idle.get(k), "busy", busy.get(k))
t = busy.get("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE")
print("PASS" if t is not None and t > 0.05 else "FAIL", "tensor active under the matmul:", t)
e1, e2 = busy.get("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"), busy2.get("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION")
print("PASS" if e1 and e2 and e2 > e1 else "FAIL", "energy rises under load: %s -> %s mJ" % (e1, e2))
PY
kill "${PIDS[@]}" 2>/dev/null; wait 2>/dev/null
if [ -x "$BENCH" ]; then
  say "poll cost: verdict alone, gauges, counters (criterion)"
  timeout 200 "$BENCH" --bench poll_incremental 2>&1 | grep -E "poll bench|time:|^poll" | tee -a "$L"
fi
