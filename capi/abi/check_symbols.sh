#!/bin/sh
# ABI guard 1/2: the dynamic symbols libchunkserve.so defines must be exactly the committed list.
#
#   check_symbols.sh <libchunkserve.so> <symbols.txt>
#
# symbols.txt holds one `nm -D --defined-only` name per line (with its @@CHUNKSERVE_<n> version);
# lines starting with # are comments. A missing symbol is an ABI break; an extra one is either a
# new function (add it to symbols.txt and to the header's contract) or a leak past the version
# script (fix capi/chunkserve.map).
set -eu
lib=$1
expected=$2
actual=$(mktemp)
want=$(mktemp)
trap 'rm -f "$actual" "$want"' EXIT
nm -D --defined-only "$lib" | awk 'NF { print $NF }' | LC_ALL=C sort > "$actual"
grep -v '^#' "$expected" | grep -v '^[[:space:]]*$' | LC_ALL=C sort > "$want"
if diff -u "$want" "$actual"; then
  echo "check_symbols: $(wc -l < "$actual") exported symbols match $expected"
  exit 0
fi
echo "check_symbols: the exported symbols of $lib differ from $expected (- committed, + built)."
echo "Removing or renaming a symbol breaks the ABI. For an intended addition, refresh the baseline:"
echo "  cmake --build <build> --target chunkserve_capi_update_abi   (see capi/README.md)"
exit 1
