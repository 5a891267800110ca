#!/usr/bin/env bash
# Side-by-side benchmark of chunkserve's worker against llama.cpp's llama-server (issue 25), in
# one command. Optional, never run in CI. Steps, each skipped when its output is already there:
#
#   1. llama.cpp: the pinned PyPI `llama-cpp-python` source package, whose sdist vendors llama.cpp
#      under vendor/llama.cpp, built CPU-only (GGML_NATIVE, no CUDA, no curl) for the two targets
#      used here, llama-server and llama-quantize, into $CHUNKSERVE_CACHE/llama.cpp-<version>.
#      Why the PyPI sdist: PyPI is the registry we can reach; it pins one llama.cpp commit.
#   2. chunkserve: the chunkserve-worker target in $BUILD (default build/).
#   3. tests/bench/llamacpp_side_by_side.py with the remaining arguments (see its --help), which
#      makes the f32/bf16 GGUFs, runs both servers and prints the table and JSON.
#
#   tests/bench/llamacpp_side_by_side.sh                 # f32 and bf16, 3 rounds
#   tests/bench/llamacpp_side_by_side.sh --rounds 5 --dtypes f32
#   tests/bench/llamacpp_side_by_side.sh --build-only    # steps 1 and 2 only
#
# Env: CHUNKSERVE_CACHE (~/.cache/chunkserve), CHUNKSERVE_VENV ($CHUNKSERVE_CACHE/venv),
# BUILD (build), JOBS (2). Builds run under nice so a shared machine stays usable.
set -euo pipefail

llama_cpp_python_version="0.3.36"
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cache="${CHUNKSERVE_CACHE:-$HOME/.cache/chunkserve}"
venv="${CHUNKSERVE_VENV:-$cache/venv}"
build="${BUILD:-$repo/build}"
jobs="${JOBS:-2}"
llama_dir="$cache/llama.cpp-$llama_cpp_python_version"
python="$venv/bin/python"
[ -x "$python" ] || python=python3

build_llama() {
  if [ -x "$llama_dir/build/bin/llama-server" ] && [ -x "$llama_dir/build/bin/llama-quantize" ]; then
    return
  fi
  mkdir -p "$llama_dir"
  local sdist="$llama_dir/llama_cpp_python-$llama_cpp_python_version.tar.gz"
  if [ ! -f "$sdist" ]; then
    "$python" -m pip download --no-binary :all: --no-deps \
      "llama-cpp-python==$llama_cpp_python_version" -d "$llama_dir" >&2
  fi
  if [ ! -d "$llama_dir/src" ]; then
    rm -rf "$llama_dir/src.tmp" && mkdir -p "$llama_dir/src.tmp"
    tar -xzf "$sdist" -C "$llama_dir/src.tmp" --strip-components=1
    mv "$llama_dir/src.tmp" "$llama_dir/src"
  fi
  local launcher=()
  if command -v ccache >/dev/null; then
    launcher=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
  fi
  cmake -S "$llama_dir/src/vendor/llama.cpp" -B "$llama_dir/build" -G Ninja \
    -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DGGML_CUDA=OFF -DLLAMA_CURL=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DBUILD_SHARED_LIBS=OFF \
    "${launcher[@]}" >&2
  nice -n 10 cmake --build "$llama_dir/build" -j "$jobs" --target llama-server llama-quantize >&2
}

build_chunkserve() {
  if [ ! -f "$build/build.ninja" ]; then
    cmake -S "$repo" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
      -DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache >&2
  fi
  nice -n 10 cmake --build "$build" -j "$jobs" --target chunkserve-worker >&2
}

build_only=0
args=()
for a in "$@"; do
  case "$a" in
    --build-only) build_only=1 ;;
    --llama-only) build_llama; exit 0 ;;
    *) args+=("$a") ;;
  esac
done

build_llama
build_chunkserve
[ "$build_only" = 1 ] && exit 0
exec "$python" "$repo/tests/bench/llamacpp_side_by_side.py" \
  --llama-bin "$llama_dir/build/bin" --worker "$build/bin/chunkserve-worker" "${args[@]}"
