#!/usr/bin/env bash
# Build a real Kubernetes API server and its etcd for the tests (tests/kube.rs), from the Go module proxy:
# k8s.io/kubernetes v1.37.2's cmd/kube-apiserver and the etcd server its go.mod names (tests/fixtures/kubeapi
# pins both, every k8s.io staging module at the matching v0.37.2). Into target/kube/bin/, rebuilt only when
# the pins change. Needs Go 1.26 (the machine's /usr/local/go).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
out=$root/target/kube/bin
stamp=$out/.pins
pins=$(cat tests/fixtures/kubeapi/go.mod tests/fixtures/kubeapi/go.sum | sha256sum | cut -d' ' -f1)
if [ -x "$out/kube-apiserver" ] && [ -x "$out/etcd" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$pins" ]; then
  exit 0
fi
export PATH=$PATH:/usr/local/go/bin
command -v go >/dev/null || { echo "kube-apiserver.sh: no Go (1.26) on PATH or in /usr/local/go" >&2; exit 1; }
mkdir -p "$out"
cd tests/fixtures/kubeapi
# The version the server reports (/version), as a release build sets it.
v=v1.37.2
flags="-s -w"
for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  flags="$flags -X $p.gitVersion=$v -X $p.gitMajor=1 -X $p.gitMinor=37 -X $p.gitTreeState=clean"
done
GOFLAGS=-mod=mod go build -trimpath -ldflags "$flags" -o "$out/kube-apiserver" k8s.io/kubernetes/cmd/kube-apiserver
GOFLAGS=-mod=mod go build -trimpath -ldflags "-s -w" -o "$out/etcd" go.etcd.io/etcd/server/v3
echo "$pins" > "$stamp"
ls -la "$out"
