# Sourced by the measurement scripts, from the repository root: BIN (the release build unless set; built
# when missing) and free_port, a free loopback port.
BIN=${BIN:-$(pwd)/target/release/gpusweep}
[ -x "$BIN" ] || cargo build --release
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
# `gpusweep serve --demo` of $1 simulated hosts (gpu-b00001...) polled every second, in the background, in a
# scratch folder D without a config: its PID in P, its port in PORT, its stderr in $D/serve.err.
start_demo_serve() {
  D=$(mktemp -d)
  export GPUSWEEP_CONFIG=$D/none.toml GPUSWEEP_SOCKET=$D/none.sock
  PORT=$(free_port)
  "$BIN" serve --demo --hosts "gpu-b[00001-$(printf '%05d' "$1")]" --listen "127.0.0.1:$PORT" --interval 1s 2>"$D/serve.err" &
  P=$!
}
