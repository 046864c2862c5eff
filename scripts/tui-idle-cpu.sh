#!/usr/bin/env bash
# CPU and memory of the idle TUI: starts `gpusweep ARGS` under tmux (160x48), lets it settle, then samples
# utime+stime and VmRSS over SECS seconds.   scripts/tui-idle-cpu.sh [SECS] [gpusweep args...]
# Example: scripts/tui-idle-cpu.sh 60 --demo --interval 1s
set -euo pipefail
cd "$(dirname "$0")/.."
SECS=${1:-60}; shift || true
source scripts/lib/host.sh
S=gpusweep-cpu-$$
CMD=$(printf '%q ' "$BIN" "$@")
tmux -L "$S" new-session -d -s cpu -x 160 -y 48 "exec $CMD"
trap 'tmux -L "$S" kill-server 2>/dev/null' EXIT
sleep 2
PID=$(tmux -L "$S" list-panes -t cpu -F '#{pane_pid}' 2>/dev/null) || { echo "gpusweep exited at once: $CMD" >&2; exit 1; }
T0=$(awk '{print $14+$15}' "/proc/$PID/stat")
sleep "$SECS"
T1=$(awk '{print $14+$15}' "/proc/$PID/stat")
RSS=$(awk '/VmRSS/{print $2}' "/proc/$PID/status")
TCK=$(getconf CLK_TCK)
awk -v t0="$T0" -v t1="$T1" -v tck="$TCK" -v s="$SECS" -v rss="$RSS" -v args="$*" \
  'BEGIN { printf "gpusweep %s: %.2f%% of one core over %d s, %.1f MB resident\n", args, 100*(t1-t0)/tck/s, s, rss/1024 }'
