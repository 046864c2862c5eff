# Sourced by the device scripts with the log's name: $OUT made, W a scratch folder (only results go to $OUT:
# few files come back from the device), the log $OUT/NAME.log emptied, and say/res that print to it.
mkdir -p "$OUT"
W=$(mktemp -d)
L=$OUT/$1.log
: >"$L"
say() { echo "== $*" | tee -a "$L"; }
res() { echo "$*" | tee -a "$L"; }
