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
"$cc" -std=c99 -Wall -Wextra -Werror -pedantic "$example" $flags -Wl,-rpath,"$libdir" \
      -o "$prefix/example"
"$prefix/example" > "$prefix/out.txt"
tail -1 "$prefix/out.txt"
ldd "$prefix/example" | grep -q "$libdir/libchunkserve.so.0" || {
  echo "install_test: the example did not load the installed library"; exit 1; }
"$(dirname "$0")/runpath_test.sh" "$prefix"
echo "install_test: ok"
