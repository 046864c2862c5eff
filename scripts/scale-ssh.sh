#!/usr/bin/env bash
# Scale: N hosts (default 64) as demo agents behind OpenSSH sshd on loopback (one daemon per 16 hosts, each
# listening on 127.0.0.1-16 on its own port). Measures the time to the first complete view (`snapshot` of every host) and the TUI client's CPU at
# a 1 s poll.   scripts/scale-ssh.sh [N] [SECS]      (needs sshd and tmux; run as root)
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-64}; SECS=${2:-30}
source scripts/lib/host.sh
D=$(mktemp -d)
trap 'for f in "$D"/sshd-*.pid; do [ -f "$f" ] && kill "$(cat "$f")" 2>/dev/null; done; rm -rf "$D"' EXIT
ssh-keygen -q -t ed25519 -N '' -f "$D/host"
ssh-keygen -q -t ed25519 -N '' -f "$D/id"
cp "$D/id.pub" "$D/authorized_keys"
mkdir -p /run/sshd "$D/home"
# sshd listens on at most 16 sockets: one daemon per 16 hosts, each on its own port, 127.0.0.1-16.
K=$(cut -d' ' -f1,2 "$D/host.pub")
HOSTS=""
: >"$D/known_hosts"
DAEMONS=$(( (N + 15) / 16 ))
for j in $(seq 0 $((DAEMONS - 1))); do
  PORT=$(free_port)
  COUNT=$(( N - j * 16 < 16 ? N - j * 16 : 16 ))
  {
    echo "Port $PORT"
    for i in $(seq 1 "$COUNT"); do echo "ListenAddress 127.0.0.$i"; done
    cat <<CFG
HostKey $D/host
AuthorizedKeysFile $D/authorized_keys
PidFile $D/sshd-$j.pid
StrictModes no
UsePAM no
PasswordAuthentication no
PermitRootLogin yes
MaxStartups 500:30:1000
MaxSessions 500
LogLevel ERROR
SetEnv GPUSWEEP_CONFIG=$D/none.toml
CFG
  } >"$D/sshd_config-$j"
  /usr/sbin/sshd -f "$D/sshd_config-$j"
  for i in $(seq 1 "$COUNT"); do
    t=0; until (exec 3<>"/dev/tcp/127.0.0.$i/$PORT") 2>/dev/null; do sleep 0.05; t=$((t+1)); [ $t -lt 200 ] || { echo "sshd is not listening on 127.0.0.$i:$PORT" >&2; exit 1; }; done
    echo "[127.0.0.$i]:$PORT $K" >>"$D/known_hosts"
  done
  HOSTS="${HOSTS:+$HOSTS,}root@127.0.0.[1-$COUNT]:$PORT"
done
common=(--hosts "$HOSTS" --known-hosts "$D/known_hosts" -i "$D/id" --remote-command "$BIN agent --demo --demo-host gpu-a" --connect-timeout 30)
export HOME=$D/home GPUSWEEP_CONFIG=$D/none.toml
unset SSH_AUTH_SOCK
START=$(date +%s.%N)
"$BIN" snapshot --json "${common[@]}" >"$D/snap.json"
END=$(date +%s.%N)
python3 - "$D/snap.json" "$START" "$END" "$N" <<'PY'
import json, sys
h = json.load(open(sys.argv[1]))["hosts"]
ok = sum(1 for x in h if x["error"] is None)
gpus = sum(len(x["gpus"]) for x in h)
print(f"snapshot of {sys.argv[4]} hosts over SSH: {ok} read, {gpus} GPUs, first complete view in {float(sys.argv[3]) - float(sys.argv[2]):.2f} s")
bad = [x["error"] for x in h if x["error"]]
if bad: print("errors:", bad[:3])
PY
BIN=$BIN scripts/tui-idle-cpu.sh "$SECS" "${common[@]}" --interval 1s
