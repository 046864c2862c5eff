#!/usr/bin/env bash
# Builds the packages (scripts/package.sh) and installs each in a clean place, as a user would:
#   the wheel into a fresh venv with pip, the .deb with dpkg (then removed and purged: nothing may be left),
#   the tarball unpacked after its SHA-256 is checked.
# Each installed gpusweep must print its version and a demo snapshot of four hosts, and ask for no glibc symbol
# newer than 2.17. scripts/test.sh runs this after the test suite; it needs root (or sudo) for dpkg and refuses
# to touch a gpusweep package that is already installed.
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
if [[ "$(dpkg-query -W -f='${Status}' gpusweep 2>/dev/null || true)" == *installed* ]]; then
  echo "test-packages: a gpusweep package is installed on this machine; not replacing it" >&2
  exit 1
fi
fail() { echo "test-packages: FAIL: $*" >&2; exit 1; }

./scripts/package.sh
version=$(cargo metadata --no-deps --format-version 1 | python3 -c 'import json,sys; print(json.load(sys.stdin)["packages"][0]["version"])')
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# $1: a gpusweep binary. Its version, a demo snapshot of the four demo hosts, and its newest glibc symbol.
check_binary() {
  local bin=$1 what=$2 out newest
  out=$("$bin" --version) || fail "$what: --version exited $?"
  [ "$out" = "gpusweep $version" ] || fail "$what: --version said '$out'"
  out=$("$bin" --demo snapshot) || fail "$what: --demo snapshot exited $?"
  [ "$(grep -c '^== gpu-[a-d] (demo' <<<"$out")" -eq 4 ] || fail "$what: the demo snapshot lacks its four hosts"
  newest=$(objdump -T "$(readlink -f "$(command -v "$bin")")" | grep -o 'GLIBC_[0-9.]*' | sed 's/GLIBC_//' | sort -V | tail -1)
  [ -n "$newest" ] || fail "$what: no glibc symbol versions read"
  [ "$(printf '%s\n2.17\n' "$newest" | sort -V | tail -1)" = "2.17" ] || fail "$what: needs GLIBC_$newest"
  echo "test-packages: $what: gpusweep $version, demo snapshot of 4 hosts, newest symbol GLIBC_$newest"
}

# The wheel, into a fresh venv, from the file alone (no index).
/usr/bin/python3 -m venv "$tmp/venv"
"$tmp/venv/bin/pip" install -q --no-index dist/gpusweep-"$version"-py3-none-*manylinux*_x86_64.whl
[ -x "$tmp/venv/bin/gpusweep" ] || fail "wheel: pip put no gpusweep in the venv's bin"
# The package index's page: its description links nothing by a relative path (an index cannot show those).
python3 - "$(ls dist/gpusweep-*-manylinux*_x86_64.whl | head -1)" <<'PY' || fail "wheel: a relative link in the long description"
import re, sys, zipfile
w = zipfile.ZipFile(sys.argv[1])
meta = next(n for n in w.namelist() if n.endswith(".dist-info/METADATA"))
text = w.read(meta).decode()
bad = [l for l in re.findall(r"\]\(([^)]*)\)", text) if not re.match(r"(https?://|#)", l)]
sys.exit(1 if bad or "Who holds this GPU memory" not in text else 0)
PY
PATH="$tmp/venv/bin:$PATH" check_binary gpusweep wheel
"$tmp/venv/bin/pip" uninstall -q -y gpusweep
[ ! -e "$tmp/venv/bin/gpusweep" ] || fail "wheel: pip uninstall left bin/gpusweep"

# The tarball: its checksum, then the binary it holds.
# The README's line, as written, from the repository root.
readme_line=$(grep -m1 'sha256sum -c' README.md | sed 's/ && tar .*//')
bash -c "$readme_line" >/dev/null || fail "tarball: the README's checksum line: $readme_line"
tar -C "$tmp" -xzf "dist/gpusweep-$version-x86_64-linux-gnu.tar.gz"
check_binary "$tmp/gpusweep-$version-x86_64-linux-gnu/gpusweep" tarball

# The .deb, with dpkg: installed, its unit verified by systemd, its man page found by man, then removed and
# purged with nothing left behind.
deb="dist/gpusweep_${version}-1_amd64.deb"
# Debian's synopsis (the Description's first line) is at most 80 characters.
# `sed -n 1p` reads to the end: `head -1` leaves dpkg-deb writing the long description into a closed pipe, and
# under pipefail its SIGPIPE (141) ended the run once.
synopsis=$(dpkg-deb -f "$deb" Description | sed -n 1p)
[ "${#synopsis}" -le 80 ] || fail "deb: the synopsis is ${#synopsis} characters (at most 80): $synopsis"
# Debian's own checks: no error and no warning (the one override the package carries says why).
lintian --tag-display-limit 0 --fail-on error,warning "$deb" || fail "deb: lintian"
dpkg-deb -c "$deb" | awk '{print $6}' | sed 's#^\./#/#' | grep -v '/$' >"$tmp/files"
for f in /usr/bin/gpusweep /usr/lib/systemd/system/gpusweep.service /usr/share/man/man1/gpusweep-serve.1.gz \
  /usr/share/bash-completion/completions/gpusweep /usr/share/zsh/vendor-completions/_gpusweep \
  /usr/share/fish/vendor_completions.d/gpusweep.fish; do
  grep -qx "$f" "$tmp/files" || fail "deb: $f is not in the package"
done
while read -r f; do [ ! -e "$f" ] || fail "deb: $f exists before the install"; done <"$tmp/files"
$sudo dpkg -i "$deb" >/dev/null
check_binary /usr/bin/gpusweep deb
systemd-analyze verify /usr/lib/systemd/system/gpusweep.service || fail "deb: systemd-analyze verify"
[ "$(man -w gpusweep-serve)" = /usr/share/man/man1/gpusweep-serve.1.gz ] || fail "deb: man -w gpusweep-serve"
bash -c 'source /usr/share/bash-completion/completions/gpusweep && complete -p gpusweep' >/dev/null \
  || fail "deb: the bash completion defines nothing for gpusweep"
$sudo dpkg -r gpusweep >/dev/null
while read -r f; do [ ! -e "$f" ] || fail "deb: $f is left after dpkg -r"; done <"$tmp/files"
$sudo dpkg -P gpusweep >/dev/null
! dpkg-query -W gpusweep >/dev/null 2>&1 || fail "deb: dpkg still knows gpusweep after purge"
[ ! -e /etc/systemd/system/gpusweep.service ] || fail "deb: a mask of gpusweep.service is left after purge"
echo "test-packages: deb: lintian clean, installed, unit verified, man page found, removed and purged cleanly"

echo "test-packages: passed in $(($(date +%s) - start)) s"
