#!/usr/bin/env bash
# The project's Debian build dependencies, carried to a GPU machine that reaches no package
# registry (the lent GPU machines have nvcc, CMake, ninja and PyTorch, but none of Boost, Cap'n
# Proto, glog, GoogleTest, Gloo, OpenBLAS, xxHash, nlohmann-json or PCRE2's headers).
#
#   kernels/cuda/gpu_deps.sh download [DIR]
#       On a Debian 12 machine with apt: the .deb files of those packages and of the libraries
#       they load that a non-Debian host may lack, into DIR/debs (default .gpu-deps, which
#       .gitignore ignores). About 34 MB.
#   kernels/cuda/gpu_deps.sh unpack [DIR] [PREFIX]
#       On the GPU machine: `dpkg -x` every .deb into PREFIX (default /tmp/chunkserve-deps), points
#       the packages' CMake and pkg-config files (which name /usr) at PREFIX/usr, makes the links
#       Debian's alternatives system would have made, and writes PREFIX/env.sh, which exports
#       CMAKE_PREFIX_PATH, PKG_CONFIG_LIBDIR, LD_LIBRARY_PATH and PATH for the build. Nothing
#       outside PREFIX is touched.
set -euo pipefail

packages=(
  libboost-dev libboost1.74-dev libpcre2-dev libpcre2-8-0 libpcre2-16-0 libpcre2-32-0
  libpcre2-posix3 capnproto libcapnp-0.9.2 libcapnp-dev libssl-dev libssl3
  libgoogle-glog-dev libgoogle-glog0v6 libgflags-dev libgflags2.2 libunwind-dev libunwind8
  liblzma-dev libgtest-dev libgmock-dev
  libgloo-dev libgloo0 libhiredis0.14 libhiredis-dev libibverbs1 libibverbs-dev
  libnl-3-200 libnl-route-3-200 libnl-3-dev libnl-route-3-dev
  libopenblas-dev libopenblas-pthread-dev libopenblas0-pthread libopenblas0 libgfortran5
  libquadmath0 libxxhash-dev libxxhash0 nlohmann-json3-dev
)

cmd="${1:-}"
dir="${2:-.gpu-deps}"
case "$cmd" in
  download)
    mkdir -p "$dir/debs"
    (cd "$dir/debs" && apt-get download "${packages[@]}")
    echo "gpu_deps: $(ls "$dir/debs" | wc -l) packages in $dir/debs ($(du -sh "$dir/debs" | cut -f1))"
    ;;
  unpack)
    prefix="${3:-/tmp/chunkserve-deps}"
    shopt -s nullglob
    debs=("$dir"/debs/*.deb)
    [[ ${#debs[@]} -gt 0 ]] || { echo "gpu_deps: no .deb files in $dir/debs" >&2; exit 2; }
    rm -rf "$prefix"
    mkdir -p "$prefix"
    for f in "${debs[@]}"; do
      if command -v dpkg > /dev/null; then
        dpkg -x "$f" "$prefix"
      else  # a .deb is an ar archive holding data.tar.*
        member=$(ar t "$f" | grep '^data\.tar')
        ar p "$f" "$member" > "$prefix/$member"
        tar -x -C "$prefix" -f "$prefix/$member"   # tar detects xz / zstd / gzip from the file
        rm "$prefix/$member"
      fi
    done
    lib="$prefix/usr/lib/x86_64-linux-gnu"
    # Debian's update-alternatives links for OpenBLAS (made by its postinst, not in the .deb).
    mkdir -p "$lib/cmake/openblas"
    for f in "$lib"/openblas-pthread/cmake/openblas/*.cmake; do
      ln -sfn "../../openblas-pthread/cmake/openblas/$(basename "$f")" "$lib/cmake/openblas/"
    done
    ln -sfn openblas-pthread/libopenblas.so.0 "$lib/libopenblas.so.0"
    ln -sfn openblas-pthread/libopenblas.so "$lib/libopenblas.so"
    ln -sfn ../../../include/x86_64-linux-gnu/openblas-pthread/cblas.h "$prefix/usr/include/cblas.h"
    # The packages' CMake and pkg-config files name /usr; point them at the prefix.
    grep -rlE '/usr(/|"|$| )' "$lib/cmake" "$lib/pkgconfig" "$prefix/usr/share/cmake" \
        "$prefix/usr/share/pkgconfig" "$lib/openblas-pthread/cmake" "$prefix/usr/share/glog" \
        2>/dev/null | xargs -r sed -i -E "s#(^|[^A-Za-z0-9_./-])/usr#\\1$prefix/usr#g"
    cat > "$prefix/env.sh" <<EOF
export CHUNKSERVE_DEPS_PREFIX="$prefix"
export CMAKE_PREFIX_PATH="$prefix/usr\${CMAKE_PREFIX_PATH:+:\$CMAKE_PREFIX_PATH}"
export PKG_CONFIG_LIBDIR="$lib/pkgconfig:$prefix/usr/share/pkgconfig"
export LD_LIBRARY_PATH="$lib:$lib/openblas-pthread:$prefix/usr/lib\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
export PATH="$prefix/usr/bin:\$PATH"
EOF
    echo "gpu_deps: ${#debs[@]} packages unpacked into $prefix; source $prefix/env.sh"
    ;;
  *)
    echo "usage: $0 download [DIR] | unpack [DIR] [PREFIX]" >&2
    exit 2
    ;;
esac
