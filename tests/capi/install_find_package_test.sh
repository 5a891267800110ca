#!/bin/sh
# `cmake --install` of libchunkserve into a scratch prefix, the prefix moved elsewhere (the CMake
# package must locate itself), then a throwaway CMake project that does find_package(chunkserve)
# builds examples/c against chunkserve::chunkserve and runs it: the installed
# chunkserveConfig.cmake, its version file (SameMajorVersion) and the exported target work, and
# the installed CMake files name neither the build tree, the source tree nor the install-time
# prefix. The project is configured with `env -i` and a minimal PATH: CMAKE_PREFIX_PATH is all it
# is given.
#
#   install_find_package_test.sh <cmake> <build dir> <generator> <make program> <C compiler>
#                                <example.c> <project version>
set -eu
cmake=$1
build=$2
generator=$3
make_program=$4
cc=$5
example=$6
version=$7
major=${version%%.*}
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
fail() { echo "install_find_package_test: $*"; exit 1; }

"$cmake" --install "$build" --prefix "$scratch/stage" > /dev/null
mv "$scratch/stage" "$scratch/prefix"
prefix=$scratch/prefix
config=$(find "$prefix" -name chunkserveConfig.cmake)
[ -n "$config" ] || fail "no chunkserveConfig.cmake under the prefix"
cmake_dir=$(dirname "$config")
for f in chunkserveConfigVersion.cmake chunkserveTargets.cmake; do
  [ -e "$cmake_dir/$f" ] || fail "missing $cmake_dir/$f"
done
echo "install_find_package_test: installed ${cmake_dir#"$prefix"/}: $(cd "$cmake_dir" && echo *)"
build_abs=$(cd "$build" && pwd)
for p in "$build_abs" "$scratch/stage" "$(cd "$(dirname "$example")/../.." && pwd)"; do
  if grep -rlF "$p" "$cmake_dir" > /dev/null; then
    fail "an installed CMake file names $p: $(grep -rlF "$p" "$cmake_dir")"
  fi
done

mkdir "$scratch/consumer"
cat > "$scratch/consumer/CMakeLists.txt" <<EOF
cmake_minimum_required(VERSION 3.16)
project(chunkserve_consumer C)
# The version file: a later major version is refused, an older minor of this one accepted.
find_package(chunkserve $((major + 1)) QUIET)
if(chunkserve_FOUND)
  message(FATAL_ERROR "find_package(chunkserve $((major + 1))) accepted \${chunkserve_VERSION}")
endif()
find_package(chunkserve $major.0 REQUIRED)
if(NOT chunkserve_VERSION STREQUAL "$version")
  message(FATAL_ERROR "chunkserve_VERSION is \${chunkserve_VERSION}, expected $version")
endif()
if(NOT TARGET chunkserve::chunkserve)
  message(FATAL_ERROR "no target chunkserve::chunkserve")
endif()
# The include directory, also for CMake < 3.23 (which skips the exported file set).
get_target_property(inc chunkserve::chunkserve INTERFACE_INCLUDE_DIRECTORIES)
list(GET inc 0 inc0)
if(NOT EXISTS "\${inc0}/chunkserve/chunkserve.h")
  message(FATAL_ERROR "chunkserve::chunkserve's INTERFACE_INCLUDE_DIRECTORIES is \${inc}")
endif()
# The engine's libraries are linked into the .so: nothing may leak into the interface.
get_target_property(deps chunkserve::chunkserve INTERFACE_LINK_LIBRARIES)
if(deps)
  message(FATAL_ERROR "chunkserve::chunkserve has link dependencies: \${deps}")
endif()
message(STATUS "consumer: chunkserve \${chunkserve_VERSION} (ABI \${chunkserve_ABI_VERSION}) from \${chunkserve_DIR}")
add_executable(example "$example")
target_link_libraries(example PRIVATE chunkserve::chunkserve)
set_target_properties(example PROPERTIES C_STANDARD 99 C_STANDARD_REQUIRED ON C_EXTENSIONS OFF)
target_compile_options(example PRIVATE -Wall -Wextra -Werror -pedantic)
EOF
clean_env() { env -i PATH=/usr/bin:/bin HOME="$scratch" "$@"; }
clean_env "$cmake" -S "$scratch/consumer" -B "$scratch/consumer/build" -G "$generator" \
    -DCMAKE_MAKE_PROGRAM="$make_program" -DCMAKE_C_COMPILER="$cc" \
    -DCMAKE_PREFIX_PATH="$prefix" > "$scratch/configure.txt" 2>&1 || {
  cat "$scratch/configure.txt"; fail "configuring the find_package project failed"; }
grep 'consumer:' "$scratch/configure.txt"
grep -qF "from $cmake_dir" "$scratch/configure.txt" || fail "chunkserve_DIR is not $cmake_dir"
clean_env "$cmake" --build "$scratch/consumer/build" > "$scratch/build.txt" 2>&1 || {
  cat "$scratch/build.txt"; fail "building the find_package project failed"; }
exe=$scratch/consumer/build/example
clean_env "$exe" > "$scratch/out.txt" || { cat "$scratch/out.txt"; fail "the example failed"; }
tail -1 "$scratch/out.txt"
loaded=$(ldd "$exe" | sed -n 's/^[[:space:]]*libchunkserve\.so\.0 => \(.*\) (0x.*$/\1/p')
case "$(readlink -f "$loaded" 2>/dev/null)" in
  "$(readlink -f "$prefix")"/lib*/libchunkserve.so.0*) ;;
  *) ldd "$exe"; fail "the example did not load the installed library";;
esac
echo "install_find_package_test: ok"
