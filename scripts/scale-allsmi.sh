#!/usr/bin/env bash
# all-smi's viewer beside gpusweep's TUI (scripts/scale-fleet.sh http N): N nodes of all-smi's own mock
# server read by `all-smi view`, measured the same way: its first complete view (its "Nodes" cell reads N/N),
# then its CPU and memory at a 1 s poll over SECS. Not part of CI.
#   scripts/scale-allsmi.sh N [SECS]
# all-smi 0.22.0 (the newest that builds with Rust 1.95) is built from crates.io into target/all-smi the
# first time, with its mock server (feature "mock"); it needs protoc, protobuf's .proto files and libdrm:
#   apt-get install protobuf-compiler libprotobuf-dev libdrm-dev
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:?hosts}; SECS=${2:-30}
A=${ALLSMI:-$(pwd)/target/all-smi/bin}
if [ ! -x "$A/all-smi" ] || [ ! -x "$A/all-smi-mock-server" ]; then
  cargo install all-smi --version 0.22.0 --features mock --locked --root "$(pwd)/target/all-smi"
fi
D=$(mktemp -d)
PIDS=()
S=allsmi-scale-$$
cleanup() { tmux -L "$S" kill-server 2>/dev/null || true; for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$D"; }
trap cleanup EXIT
FIRST=${PORT_BASE:-31001}; LAST=$((FIRST + N - 1))
"$A/all-smi-mock-server" --port-range "$FIRST-$LAST" -o "$D/hosts.csv" >"$D/mock.log" 2>&1 &
PIDS+=($!)
MOCK_PID=$!
until [ -s "$D/hosts.csv" ] && [ "$(wc -l <"$D/hosts.csv")" -ge "$N" ] && curl -sf "http://127.0.0.1:$LAST/metrics" >/dev/null 2>&1; do sleep 0.1; done
T0=$(date +%s.%N)
tmux -L "$S" new-session -d -s scale -x 160 -y 48 "SUPPRESS_LOCALHOST_WARNING=1 exec $A/all-smi view --hostfile $D/hosts.csv --interval 1"
until tmux -L "$S" capture-pane -p -t scale | grep -Eq "│ $N/$N +│"; do
  sleep 0.02
  if awk -v t0="$T0" -v now="$(date +%s.%N)" 'BEGIN { exit !(now - t0 > 120) }'; then echo "all-smi: not every node after 120 s" >&2; break; fi
done
T1=$(date +%s.%N)
PID=$(tmux -L "$S" list-panes -t scale -F '#{pane_pid}')
awk -v a="$T0" -v b="$T1" -v n="$N" 'BEGIN { printf "all-smi %d hosts: first complete view in %.2f s\n", n, b - a }'
sleep 3
C0=$(awk '{print $14+$15}' "/proc/$PID/stat"); M0=$(awk '{print $14+$15}' "/proc/$MOCK_PID/stat")
sleep "$SECS"
C1=$(awk '{print $14+$15}' "/proc/$PID/stat"); M1=$(awk '{print $14+$15}' "/proc/$MOCK_PID/stat")
RSS=$(awk '/VmRSS/{print $2}' "/proc/$PID/status")
awk -v c0="$M0" -v c1="$M1" -v tck="$(getconf CLK_TCK)" -v s="$SECS" -v n="$N" \
  'BEGIN { printf "all-smi %d hosts: the mock server meanwhile: %.1f%% of one core\n", n, 100*(c1-c0)/tck/s }'
awk -v c0="$C0" -v c1="$C1" -v tck="$(getconf CLK_TCK)" -v s="$SECS" -v rss="$RSS" -v n="$N" \
  'BEGIN { printf "all-smi %d hosts: viewer at a 1 s poll: %.1f%% of one core over %d s, %.0f MB resident\n", n, 100*(c1-c0)/tck/s, s, rss/1024 }'
