#!/bin/sh
# The Go or the Rust bindings against an installed libchunkserve, found through pkg-config alone:
# `cmake --install` into a scratch prefix (installed elsewhere, then moved there: the .pc file
# locates itself), the bindings and their example copied out of the source tree with the test
# fixtures they read (tests/testing/tls), in the checkout's layout (nothing is written into the
# source tree, and nothing else of the checkout or the build tree is in reach), then
#
#   go:   go vet, go test -short ./... of bindings/go, go build of examples/go, which is run;
#   rust: cargo test --workspace of bindings/rust, cargo build of examples/rust, which is run;
#
# each under `env -i` with only PATH (the toolchain, /usr/bin, /bin), HOME (a scratch directory,
# which holds the Go and Cargo caches) and PKG_CONFIG_PATH=<prefix>/lib/pkgconfig, plus the
# toolchains' offline settings (GOPROXY=off GOFLAGS=-mod=mod GOTOOLCHAIN=local; cargo --offline
# --locked). The examples run with PATH alone: the rpath must find the library. The tests that
# need CHUNKSERVE_WORKER_BIN and the like skip themselves (Go) or stay ignored (Rust).
#
#   install_bindings_test.sh go   <cmake> <build dir> <source dir> <work dir> <pkg-config> <go>
#   install_bindings_test.sh rust <cmake> <build dir> <source dir> <work dir> <pkg-config> <cargo>
#                                 <rustc>
#
# A tool given as NONE (not found, or the bindings are off in this build) skips the test: exit 77.
# <work dir> is emptied first and removed after a pass (kept after a failure, to look at).
set -eu
lang=$1
cmake=$2
build=$3
source=$4
work=$5
pkg_config=$6
tool=$7
rustc=${8:-NONE}
me="install_bindings_test ($lang)"
skip() { echo "$me: skipped: $*"; exit 77; }
fail() { echo "$me: FAILED: $*"; echo "$me: (scratch files kept in $work)"; exit 1; }

case $lang in
  go) [ "$tool" != NONE ] || skip "the Go bindings are not built here (go >= 1.19 not found," \
                                  "CHUNKSERVE_BUILD_BINDINGS=OFF or CHUNKSERVE_SANITIZE)";;
  rust) if [ "$tool" = NONE ] || [ "$rustc" = NONE ]; then
          skip "the Rust bindings are not built here (cargo with rustc >= 1.77 not found," \
               "CHUNKSERVE_BUILD_BINDINGS=OFF or CHUNKSERVE_SANITIZE)"
        fi;;
  *) echo "$me: unknown language"; exit 2;;
esac
[ -x "$tool" ] || skip "$tool is not executable"
[ "$pkg_config" != NONE ] || skip "pkg-config not found"

# Go's module cache is read-only; make everything removable first.
[ ! -e "$work" ] || chmod -R u+w "$work"
rm -rf "$work"
mkdir -p "$work/src/bindings" "$work/src/examples" "$work/home" "$work/bin"

"$cmake" --install "$build" --prefix "$work/stage" > "$work/install.txt"
mv "$work/stage" "$work/prefix"
prefix=$work/prefix
pc=$(find "$prefix" -name chunkserve.pc)
[ -n "$pc" ] || fail "no chunkserve.pc under $prefix"
pc_dir=$(dirname "$pc")

# The toolchain's own directory first. For Rust, the toolchain's bin (rustc --print sysroot), not
# rustup's proxies, which would need rustup's home.
tool_dir=$(dirname "$tool")
if [ "$lang" = rust ]; then
  sysroot=$("$rustc" --print sysroot)
  if [ -x "$sysroot/bin/cargo" ] && [ -x "$sysroot/bin/rustc" ]; then
    tool_dir=$sysroot/bin
  fi
fi
tool_name=$(basename "$tool")
clean_path="$tool_dir:$(dirname "$pkg_config"):/usr/bin:/bin"
# What the embedder sets: PKG_CONFIG_PATH only (and for Go its offline module settings).
with_pkg_config() {
  if [ "$lang" = go ]; then
    env -i PATH="$clean_path" HOME="$work/home" PKG_CONFIG_PATH="$pc_dir" \
        GOFLAGS=-mod=mod GOPROXY=off GOTOOLCHAIN=local GOTELEMETRY=off "$@"
  else
    env -i PATH="$clean_path" HOME="$work/home" PKG_CONFIG_PATH="$pc_dir" "$@"
  fi
}
step() {  # step <name> <dir> <command>...: runs it, prints its last lines, fails with its log
  name=$1 dir=$2
  shift 2
  log="$work/$(echo "$name" | tr ' /' '__').txt"
  if (cd "$dir" && "$@") > "$log" 2>&1; then
    echo "$me: $name: ok"
  else
    cat "$log"
    fail "$name"
  fi
}
check_loads_installed() {  # the program loads libchunkserve from the prefix
  loaded=$(ldd "$1" | sed -n 's/^[[:space:]]*libchunkserve\.so\.0 => \(.*\) (0x.*$/\1/p')
  case "$(readlink -f "$loaded" 2>/dev/null)" in
    "$(readlink -f "$prefix")"/lib*/libchunkserve.so.0*) ;;
    *) ldd "$1"; readelf -d "$1" | grep -E 'R(UN)?PATH' || echo "(no RUNPATH)"
       fail "$1 does not load the installed libchunkserve.so.0";;
  esac
}

flags=$(with_pkg_config pkg-config --cflags --libs chunkserve)
echo "$me: pkg-config --cflags --libs chunkserve: $flags"
case "$flags" in
  *-Wl,-rpath*) ;;
  *) skip "the installed chunkserve.pc has no rpath (CHUNKSERVE_PKG_CONFIG_RPATH=OFF): programs" \
          "linked with its flags alone need the library in the loader's default path";;
esac
# The copies keep the checkout's layout: the tests read its TLS fixtures as ../../tests/testing/tls.
mkdir -p "$work/src/tests/testing"
cp -R "$source/tests/testing/tls" "$work/src/tests/testing/tls"
if [ "$lang" = go ]; then
  cp -R "$source/bindings/go" "$work/src/bindings/go"
  cp -R "$source/examples/go" "$work/src/examples/go"
  echo "$me: $(with_pkg_config "$tool_name" version)"
  step "go vet" "$work/src/bindings/go" with_pkg_config go vet ./...
  step "go test -short" "$work/src/bindings/go" with_pkg_config go test -count=1 -short ./...
  grep -E '^(ok|FAIL|---)' "$work/go_test_-short.txt" || true
  # The test binary as go test built it, for the library it loads.
  step "go test -c" "$work/src/bindings/go" with_pkg_config go test -c -o "$work/bin/chunkserve.test" .
  check_loads_installed "$work/bin/chunkserve.test"
  step "go build examples/go" "$work/src/examples/go" \
      with_pkg_config go build -o "$work/bin/chunkserve-example-go" .
  example=$work/bin/chunkserve-example-go
else
  # Without target/ directories a checkout may hold.
  tar -C "$source/bindings" --exclude=target -cf - rust | tar -C "$work/src/bindings" -xf -
  tar -C "$source/examples" --exclude=target -cf - rust | tar -C "$work/src/examples" -xf -
  # The header-drift test reads <checkout>/capi/include/chunkserve/chunkserve.h: here, the
  # installed header.
  mkdir "$work/src/capi"
  ln -s "$prefix/include" "$work/src/capi/include"
  echo "$me: $(with_pkg_config cargo --version), $(with_pkg_config rustc --version)"
  step "cargo test" "$work/src/bindings/rust" \
      with_pkg_config cargo test --offline --locked --workspace
  grep -E '^(test result|     Running|   Doc-tests)' "$work/cargo_test.txt" | paste - - |
    sed 's/  */ /g' || true
  for t in "$work"/src/bindings/rust/target/debug/deps/engine-*; do
    if [ -x "$t" ]; then check_loads_installed "$t"; fi
  done
  step "cargo build examples/rust" "$work/src/examples/rust" \
      with_pkg_config cargo build --offline --locked
  example=$work/src/examples/rust/target/debug/chunkserve-example
fi

# The example with nothing but PATH: its rpath must lead to the installed library.
if env -i PATH=/usr/bin:/bin "$example" > "$work/example.txt" 2>&1; then
  echo "$me: example: $(tail -1 "$work/example.txt")"
else
  cat "$work/example.txt"
  readelf -d "$example" | grep -E 'R(UN)?PATH' || {
    echo "$me: $example has no RUNPATH"
    if [ "$lang" = rust ]; then
      echo "$me: (Cargo gives chunkserve-sys's rustc-link-arg rpath to no other package: the" \
           "program's build.rs must add it, from DEP_CHUNKSERVE_RPATH, which only a direct" \
           "dependent of chunkserve-sys sees; examples/rust/build.rs reads CHUNKSERVE_LIB_DIR only)"
    fi; }
  fail "the example did not run with PATH alone"
fi
check_loads_installed "$example"
chmod -R u+w "$work"
rm -rf "$work"
echo "$me: ok"
