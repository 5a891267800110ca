#!/bin/sh
# `cmake --install` of libchunkserve into a scratch prefix, then a C program built against it
# through pkg-config only, and run: the installed header, library, soname links and .pc work, and
# no installed file has an empty or relative RUNPATH entry.
#
#   install_test.sh <cmake> <build dir> <C compiler> <example.c>
set -eu
cmake=$1
build=$2
cc=$3
example=$4
prefix=$(mktemp -d)
trap 'rm -rf "$prefix"' EXIT
"$cmake" --install "$build" --prefix "$prefix" > /dev/null
libdir=$(dirname "$(find "$prefix" -name chunkserve.pc)")/../
libdir=$(cd "$libdir" && pwd)
for f in "$prefix/include/chunkserve/chunkserve.h" "$libdir/libchunkserve.so" \
         "$libdir/libchunkserve.so.0"; do
  [ -e "$f" ] || { echo "install_test: missing $f"; exit 1; }
done
export PKG_CONFIG_PATH="$libdir/pkgconfig"
flags=$(pkg-config --cflags --libs chunkserve)
echo "install_test: pkg-config gives: $flags"
# The .pc's Libs carry the rpath (CHUNKSERVE_PKG_CONFIG_RPATH, on unless configured for /usr).
case "$flags" in
  *-Wl,-rpath*) rpath="";;
  *) rpath="-Wl,-rpath,$libdir";;
esac
# shellcheck disable=SC2086 # the flags are words
"$cc" -std=c99 -Wall -Wextra -Werror -pedantic "$example" $flags $rpath -o "$prefix/example"
"$prefix/example" > "$prefix/out.txt"
tail -1 "$prefix/out.txt"
# The library the loader picked (by the .pc's rpath, which may read lib/pkgconfig/../../lib).
loaded=$(ldd "$prefix/example" | sed -n 's/^[[:space:]]*libchunkserve\.so\.0 => \(.*\) (0x.*$/\1/p')
if [ -z "$loaded" ] ||
   [ "$(readlink -f "$loaded")" != "$(readlink -f "$libdir/libchunkserve.so.0")" ]; then
  echo "install_test: the example did not load the installed library (it loads '$loaded')"; exit 1
fi
"$(dirname "$0")/runpath_test.sh" "$prefix"
echo "install_test: ok"
