#!/usr/bin/env bash
# The README screenshots: the real binary on the demo cluster under tmux, captured with colours (tmux
# capture-pane -e), turned into HTML by aha and into PNGs by headless Chromium: the warm-up chart, and the
# timeline of a sweep.
# Needs tmux, aha, chromium and a monospace font (apt-get install tmux aha chromium fonts-dejavu-core).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib/host.sh
D=$(mktemp -d)
S=gpusweep-shot-$$
N=0
trap 'for i in $(seq 0 "$N"); do tmux -L "$S-$i" kill-server 2>/dev/null; done; rm -rf "$D"' EXIT

# shot NAME KEYS... : start the demo, let it warm up, type KEYS (a number sleeps that long), capture NAME.png.
shot() {
  local out=$1; shift
  # A tmux server of its own per shot: one just killed may still be going away.
  N=$((N + 1))
  local S="$S-$N"
  tmux -L "$S" new-session -d -s shot -x 150 -y 40 "GPUSWEEP_CONFIG=$D/none.toml GPUSWEEP_AUDIT_LOG=$D/a.jsonl exec $BIN --demo"
  sleep 4                                 # a few readings, so the sparklines have history
  for k in "$@"; do
    case $k in
      [0-9]*) sleep "$k" ;;
      *) tmux -L "$S" send-keys -t shot "$k" ;;
    esac
  done
  sleep 1.2
  tmux -L "$S" capture-pane -e -p -t shot >"$D/screen.ansi"
  aha --black --title gpusweep <"$D/screen.ansi" >"$D/screen.html"
  # A tighter monospace page than aha's default.
  sed -i 's|<head>|<head><style>body{margin:8px;background:#000} pre{font-family:"DejaVu Sans Mono",monospace;font-size:13px;line-height:1.2}</style>|' "$D/screen.html"
  chromium --headless --no-sandbox --disable-gpu --disable-quic --no-first-run --disable-background-networking \
    --disable-component-update --disable-sync --hide-scrollbars --user-data-dir="$D/profile" \
    --window-size=1240,660 --screenshot="$D/shot.png" "file://$D/screen.html" >/dev/null 2>&1
  mkdir -p "$(dirname "$out")"
  cp "$D/shot.png" "$out"
  echo "wrote $out"
}

# gpu-a warming up an EP8 server: its memory chart beside the findings.
shot assets/screenshot.png 20 c
# gpu-b swept: the timeline of the signals, their fates and the time to clean.
shot assets/timeline.png j Enter S Tab Enter 2 Escape 0.5 e
