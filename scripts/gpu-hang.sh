#!/usr/bin/env bash
# A job that hangs alive, and loads that must never read hung, on a real GPU (issue 62). A serve watches at
# 1 s with the hang window HANG (default 60s) and the settle window 20s; each scene starts a launcher whose
# ranks (scripts/gpu/load.py) share GPU 0, and reads the job's phase, its evidence and the GPU's signals from
# the serve every 5 s for MIN minutes:
#   hung     three ranks spin (torch.cuda._sleep, a collective's wait), one sleeps on the CPU: `hung` expected
#            within HANG plus a reading (on one GPU every rank's GPU spins, so the sleeping rank cannot be
#            told from its GPU: the waited-on rank is named only where ranks have GPUs of their own)
#   matmul   a bf16 matmul loop; idle: a settled job; pause: 2 minutes of CPU work with the GPU idle; copy: a
#            memory-bound copy loop: never `hung`
# Writes $OUT/hang.log (one line per scene) and $OUT/hang-SCENE.tsv (seconds, phase, why, util %, W, SM,
# tensor, DRAM ratios).
#   SCENES="hung matmul idle pause copy" MIN=5 OUT=$OUT BIN=.gpu/gpusweep scripts/gpu-hang.sh
set -u
cd "$(dirname "$0")/.."
BIN=${BIN:-.gpu/gpusweep}
OUT=${OUT:-/tmp/gpusweep-hang}
MIN=${MIN:-5}
HANG=${HANG:-60s}
SCENES=${SCENES:-hung matmul idle pause copy}
source scripts/lib/gpu-log.sh hang
export PYTHONUNBUFFERED=1 GPUSWEEP_AUDIT_LOG=$W/actions.jsonl GPUSWEEP_CONFIG=$W/config.toml
printf '[jobs]\nsettle = "20s"\nhang = "%s"\n' "$HANG" >"$W/config.toml"
SRV=""
trap 'pkill -9 -f scripts/gpu/load.py 2>/dev/null; [ -n "$SRV" ] && kill "$SRV" 2>/dev/null; rm -rf "$W"' EXIT
say "gpu-hang: $SCENES, $MIN min each, hang window $HANG ($(date -u +%FT%TZ)); $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader -i 0)"
"$BIN" serve --listen 127.0.0.1:19403 --no-socket --interval 1s 2>"$W/serve.err" &
SRV=$!
for _ in $(seq 1 40); do curl -sf http://127.0.0.1:19403/healthz >/dev/null && break; sleep 0.25; done
for scene in $SCENES; do
  case $scene in
    hung) loads="spin spin spin sleep" ;;
    *) loads="$scene" ;;
  esac
  tsv=$OUT/hang-$scene.tsv
  : >"$tsv"
  # The ranks: children of one launcher shell, each holding 2 GiB.
  (for l in $loads; do python3 scripts/gpu/load.py "$l" $((MIN * 60 + 30)) 2 & done; wait) >"$W/$scene.out" 2>&1 &
  LP=$!
  t0=$(date +%s)
  first_hung=""
  while [ $(( $(date +%s) - t0 )) -lt $((MIN * 60)) ]; do
    sleep 5
    curl -sf http://127.0.0.1:19403/api/v1/snapshot >"$W/snap.json" || continue
    row=$(python3 - "$W/snap.json" <<'PY'
import json, sys
h = json.load(open(sys.argv[1]))["hosts"][0]
jobs = [j for j in h.get("jobs", []) if j.get("ranks")]
g = h["gpus"][0]
c = g.get("counters") or {}
j = max(jobs, key=lambda j: len(j["ranks"])) if jobs else {}
print("\t".join(str(x) for x in [j.get("phase", "-"), j.get("phase_why", "-"), j.get("waiting_on", []),
    g.get("utilization"), (g.get("power_mw") or 0) // 1000, c.get("gr_engine_active"), c.get("tensor_active"),
    c.get("dram_active")]))
PY
)
    s=$(( $(date +%s) - t0 ))
    echo "$s	$row" >>"$tsv"
    case $row in hung*) [ -z "$first_hung" ] && first_hung=$s ;; esac
  done
  pkill -9 -f scripts/gpu/load.py 2>/dev/null
  wait "$LP" 2>/dev/null
  phases=$(cut -f2 "$tsv" | sort | uniq -c | tr '\n' ' ')
  if [ "$scene" = hung ]; then
    [ -n "$first_hung" ] && v=PASS || v=FAIL
    res "$scene: $v hung first read at ${first_hung:-never} s (window $HANG); phases: $phases"
  else
    [ -z "$first_hung" ] && v=PASS || v=FAIL
    res "$scene: $v no hung over $MIN min (first at ${first_hung:-never}); phases: $phases"
  fi
  for _ in $(seq 1 40); do [ "$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -i 0 | tr -d ' ')" -lt 100 ] && break; sleep 0.5; done
done
! grep -q FAIL "$L"
