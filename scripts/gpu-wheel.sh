#!/usr/bin/env bash
# On a GPU host: the manylinux2014 wheel (staged in .gpu/ by scripts/package.sh + scripts/stage-gpu.sh) installed
# with pip into a fresh venv, without an index, then `gpusweep snapshot` of the real GPUs through it.
# Results in $OUT (default /tmp/gpusweep-wheel): summary.txt (PASS/FAIL), wheel.log, snapshot.json.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpusweep-wheel}
mkdir -p "$OUT"
SUM=$OUT/summary.txt LOG=$OUT/wheel.log
: >"$SUM"; : >"$LOG"
pass() { echo "PASS $*" | tee -a "$SUM"; }
fail() { echo "FAIL $*" | tee -a "$SUM"; }
export GPUSWEEP_CONFIG=/nonexistent/gpusweep.toml
whl=$(ls .gpu/gpusweep-*-manylinux*_x86_64.whl 2>/dev/null | head -1)
[ -n "$whl" ] || { fail "no wheel in .gpu/ (run scripts/package.sh, then scripts/stage-gpu.sh)"; exit 1; }
V=$(mktemp -d)
trap 'rm -rf "$V"' EXIT
{ python3 --version; ldd --version | head -1; uname -r; } >>"$LOG" 2>&1
if python3 -m venv "$V/venv" >>"$LOG" 2>&1 && "$V/venv/bin/pip" install --no-index "$whl" >>"$LOG" 2>&1; then
  pass "pip install --no-index $(basename "$whl")"
else
  fail "pip install of the wheel"; exit 1
fi
"$V/venv/bin/gpusweep" --version >>"$LOG" 2>&1 && pass "gpusweep --version from the venv" || fail "--version"
"$V/venv/bin/gpusweep" snapshot --json >"$OUT/snapshot.json" 2>>"$LOG"
rc=$?
gpus=$(python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(sum(len(h.get("gpus") or []) for h in d["hosts"]))' "$OUT/snapshot.json" 2>>"$LOG")
n=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
if [ "$rc" -ne 2 ] && [ -n "$gpus" ] && [ "$gpus" -eq "$n" ] && [ "$n" -gt 0 ]; then
  pass "snapshot through the wheel's binary: exit $rc, $gpus GPU(s) read, nvidia-smi lists $n"
else
  fail "snapshot: exit $rc, ${gpus:-no} GPU(s) read, nvidia-smi lists $n"
fi
"$V/venv/bin/gpusweep" snapshot >>"$LOG" 2>&1
cat "$SUM"
