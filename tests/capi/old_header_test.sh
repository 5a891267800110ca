#!/bin/sh
# A program built against an older header runs on this library: examples/c's two programs are
# compiled against release 0.1's header (tests/capi/old_header, a frozen copy: version 1 of every
# struct, the 0.1 function set) and linked with the library built here, then run, the remote one
# against a real chunkserve-worker. (The other direction, a newer header's bigger structs on this
# library, is CapiOptionsTest.ANewerCallersBiggerStructsWorkWhileTheirNewFieldsAreZero.)
#
#   old_header_test.sh <C compiler> <source dir> <build lib dir> <chunkserve-worker>
set -eu
cc=$1
src=$2
libdir=$3
worker=$4
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
for example in shared_prefix remote_client; do
  "$cc" -std=c99 -Wall -Wextra -Werror -pedantic -I "$src/tests/capi/old_header" \
        "$src/examples/c/$example.c" -L "$libdir" -lchunkserve -Wl,-rpath,"$libdir" \
        -o "$out/$example"
done
grep -q '#define CHUNKSERVE_VERSION_MINOR 1$' "$src/tests/capi/old_header/chunkserve/chunkserve.h"
"$out/shared_prefix" > "$out/shared_prefix.txt"
tail -2 "$out/shared_prefix.txt"
"$src/examples/c/run_remote_example.sh" "$worker" "$out/remote_client" | tail -2
echo "old_header_test: ok (0.1 header programs on library $(basename "$(readlink -f "$libdir/libchunkserve.so")"))"
