#!/bin/sh
# libchunkserve.so links no CUDA library; a CUDA engine comes from the plugin libchunkserve_cuda.so.0
# loaded by soname (runtime/backend/cuda_plugin.h):
#  1. ldd of libchunkserve.so shows no CUDA library;
#  2. with the plugin next to it (a CUDA build), a CUDA engine is created or refused by the
#     backend itself (no device here: UNAVAILABLE "no CUDA device"), never "cannot load";
#  3. a copy of libchunkserve.so without the plugin beside it answers UNAVAILABLE naming the plugin
#     (a build without CUDA: UNIMPLEMENTED in both cases).
#
#   cuda_plugin_test.sh <build lib dir> <cuda_probe program>
set -eu
libdir=$1
probe=$2
fail() { echo "cuda_plugin_test: $*"; exit 1; }

if ldd "$libdir/libchunkserve.so" | grep -Eq 'libcuda|libcublas|libnccl'; then
  ldd "$libdir/libchunkserve.so"
  fail "libchunkserve.so needs a CUDA library"
fi
echo "cuda_plugin_test: libchunkserve.so needs no CUDA library"

with=$("$probe")
echo "cuda_plugin_test: with the plugin: $with"
if [ -e "$libdir/libchunkserve_cuda.so.0" ]; then
  case "$with" in
    OK*) ;;
    UNAVAILABLE*"no CUDA device"*) ;;
    *) fail "expected OK or UNAVAILABLE (no CUDA device) with the plugin present" ;;
  esac
else
  case "$with" in UNIMPLEMENTED*) ;; *) fail "expected UNIMPLEMENTED in a build without CUDA" ;; esac
fi

alone=$(mktemp -d)
trap 'rm -rf "$alone"' EXIT
cp -P "$libdir"/libchunkserve.so* "$alone"/
without=$(LD_LIBRARY_PATH="$alone" "$probe")
echo "cuda_plugin_test: without the plugin: $without"
if [ -e "$libdir/libchunkserve_cuda.so.0" ]; then
  case "$without" in
    UNAVAILABLE*"cannot load libchunkserve_cuda.so.0"*) ;;
    *) fail "expected UNAVAILABLE naming libchunkserve_cuda.so.0 without the plugin" ;;
  esac
else
  case "$without" in UNIMPLEMENTED*) ;; *) fail "expected UNIMPLEMENTED" ;; esac
fi
echo "cuda_plugin_test: ok"
