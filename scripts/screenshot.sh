#!/usr/bin/env bash
# The README screenshot: the real binary on the demo cluster under tmux (gpu-b opened, just after a pkill),
# captured with colours (tmux capture-pane -e), turned into HTML by aha and into a PNG by headless Chromium.
# Needs tmux, aha, chromium and a monospace font (apt-get install tmux aha chromium fonts-dejavu-core).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-target/release/gpusweep}
[ -x "$BIN" ] || cargo build --release
OUTPNG=${1:-assets/screenshot.png}
D=$(mktemp -d)
S=gpusweep-shot-$$
trap 'tmux -L "$S" kill-server 2>/dev/null; rm -rf "$D"' EXIT
tmux -L "$S" new-session -d -s shot -x 150 -y 40 "GPUSWEEP_CONFIG=$D/none.toml exec $BIN --demo"
sleep 4                                   # a few readings, so the sparklines have history
tmux -L "$S" send-keys -t shot j Enter Tab Tab
sleep 1.2
tmux -L "$S" capture-pane -e -p -t shot >"$D/screen.ansi"
aha --black --title gpusweep <"$D/screen.ansi" >"$D/screen.html"
# A tighter monospace page than aha's default.
sed -i 's|<head>|<head><style>body{margin:8px;background:#000} pre{font-family:"DejaVu Sans Mono",monospace;font-size:13px;line-height:1.2}</style>|' "$D/screen.html"
chromium --headless --no-sandbox --disable-gpu --disable-quic --no-first-run --disable-background-networking \
  --disable-component-update --disable-sync --hide-scrollbars --user-data-dir="$D/profile" \
  --window-size=1240,660 --screenshot="$D/shot.png" "file://$D/screen.html" >/dev/null 2>&1
mkdir -p "$(dirname "$OUTPNG")"
cp "$D/shot.png" "$OUTPNG"
echo "wrote $OUTPNG"
