#!/usr/bin/env bash
# Mutation check: plants each small bug of tests/mutation/mutations/*.patch, one at a time, in a
# scratch copy of the repository, rebuilds only the test targets the patch names, runs the ctest
# selection it names and reports KILLED (a test failed) or SURVIVED (the suite missed the bug).
#
#   bash tests/mutation/run.sh                      every mutation
#   bash tests/mutation/run.sh NAME...              some of them (names as in --list)
#   bash tests/mutation/run.sh --list               names, areas and the bug each plants
#   options: -j N (build and ctest parallelism, default nproc), --dirty (copy the working tree's
#            uncommitted changes and untracked files too, not just HEAD), --no-baseline (skip
#            the unmutated run of the selected tests), --keep (leave the scratch copy)
#
# Exit status 0 only when every selected mutation was killed; non-zero when one survived, a
# patch no longer applies (the code moved: refresh the patch), a selection matched no test, or
# the unmutated baseline failed. Not registered with ctest: it rebuilds, too slow for CI.
#
# Patch format (tests/README.md, "Mutation check"): a git diff after header lines, which
# git apply skips as text before the first `diff --git`:
#   # area: kvcache                               (for the report)
#   # targets: chunkserve_kvcache_test            (ninja targets to rebuild)
#   # tests: -R ^CollidingPrefixTreeTest\.         (ctest selection; only tests of the targets)
#   # why: the bug it plants                      (one line)
#   # timeout: 300                                (optional, seconds per test)
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(git -C "$here" rev-parse --show-toplevel)"
mutations_dir="$here/mutations"

jobs="$(nproc)"
dirty=0
baseline=1
keep=0
list=0
names=()
while (($#)); do
  case "$1" in
    -j) jobs="$2"; shift 2 ;;
    -j*) jobs="${1#-j}"; shift ;;
    --dirty) dirty=1; shift ;;
    --no-baseline) baseline=0; shift ;;
    --keep) keep=1; shift ;;
    --list) list=1; shift ;;
    -h|--help) sed -n '2,23p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "run.sh: unknown option $1" >&2; exit 2 ;;
    *) names+=("${1%.patch}"); shift ;;
  esac
done

# header FILE KEY: the value of "# KEY: value" before the first diff line ("" when absent).
header() {
  awk -v key="$2" '/^diff --git/ { exit } $0 ~ "^# " key ":" { sub("^# " key ": *", ""); print; exit }' "$1"
}

if ((${#names[@]} == 0)); then
  for p in "$mutations_dir"/*.patch; do names+=("$(basename "$p" .patch)"); done
fi
for n in "${names[@]}"; do
  p="$mutations_dir/$n.patch"
  [[ -f "$p" ]] || { echo "run.sh: no mutation named $n ($p)" >&2; exit 2; }
  for key in area targets tests why; do
    [[ -n "$(header "$p" "$key")" ]] || { echo "run.sh: $n.patch has no '# $key:' line" >&2; exit 2; }
  done
done

if ((list)); then
  for n in "${names[@]}"; do
    p="$mutations_dir/$n.patch"
    printf '%-36s %-9s %s\n' "$n" "$(header "$p" area)" "$(header "$p" why)"
  done
  exit 0
fi

# The scratch copy lives at a fixed path inside the (ignored) build-mutation/ folder, not in a
# fresh mktemp directory: test sources are compiled with the source path in a define
# (CHUNKSERVE_SOURCE_DIR), so only a stable path lets ccache reuse them from one run to the next.
# A lock keeps two runs from sharing it.
scratch="$repo/build-mutation"
src="$scratch/src"
build="$src/build"
mkdir -p "$scratch"
exec 9>"$scratch/lock"
flock -n 9 || { echo "run.sh: another mutation run holds $scratch/lock" >&2; exit 2; }
# Builds and tests run as background jobs, each in its own process group (set -m), while the
# script waits on them: bash defers a trap while a foreground child runs (and ninja and ctest exit
# normally on Ctrl-C, which bash then takes as handled, going on with the next mutation), but a
# wait returns at once. The trap then ends the job's whole group, tests and servers included.
set -m
child=0
run_waiting() {
  "$@" &
  child=$!
  local rc=0
  wait "$child" || rc=$?
  child=0
  return "$rc"
}
cleanup() {
  if ((child)); then
    kill -TERM -- "-$child" 2>/dev/null || true
    wait "$child" 2>/dev/null || true
  fi
  if ((keep)); then
    echo "scratch copy kept in $src" >&2
  else
    rm -rf "$scratch"
  fi
}
trap cleanup EXIT
exec 3>&2  # the trap may fire inside a redirection to a log: report on the real stderr
trap 'echo "run.sh: interrupted" >&3; exit 130' INT TERM

# Everything git runs below stays inside the copy: without the ceiling, `git apply` in $src would
# find the enclosing worktree and silently skip paths outside the current directory.
export GIT_CEILING_DIRECTORIES="$scratch"

rm -rf "$src"
mkdir -p "$src"
if ((dirty)); then
  # Tracked files as they are in the working tree, plus untracked files that are not ignored.
  (cd "$repo" && git ls-files -z --cached --others --exclude-standard |
     tar --null -T - --ignore-failed-read -cf - 2>/dev/null) | tar -x -C "$src"
  source_desc="$(git -C "$repo" rev-parse --short HEAD) + working tree"
else
  git -C "$repo" archive HEAD | tar -x -C "$src"
  source_desc="$(git -C "$repo" rev-parse --short HEAD)"
fi

# One build directory for every mutation: Release as CI builds it (warnings are errors there
# too), CUDA, bindings and examples off (no mutation targets them), ccache when installed.
launcher=()
if command -v ccache >/dev/null 2>&1; then
  launcher=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
fi
echo "== configuring $src ($source_desc)"
run_waiting cmake -S "$src" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCHUNKSERVE_WARNINGS_AS_ERRORS=ON -DCHUNKSERVE_CUDA=OFF -DCHUNKSERVE_BUILD_BINDINGS=OFF \
  -DCHUNKSERVE_BUILD_EXAMPLES=OFF "${launcher[@]}" >"$scratch/configure.log" 2>&1 ||
  { cat "$scratch/configure.log" >&2; exit 1; }

# run_tests LOG TIMEOUT CTEST-ARGS...: 0 when every selected test passed; 3 when none matched.
run_tests() {
  local log="$1" timeout="$2"
  shift 2
  local rc=0
  run_waiting ctest --test-dir "$build" -j "$jobs" --timeout "$timeout" --output-on-failure "$@" \
    >"$log" 2>&1 || rc=$?
  if grep -q "No tests were found" "$log"; then return 3; fi
  return "$rc"
}

# failed_tests LOG: the first failed test of a ctest log, and how many more failed.
failed_tests() {
  sed -n '/The following tests FAILED:/,$p' "$1" | awk '/ - / { n++; if (n == 1) first = $3 }
    END { if (n > 1) printf "%s (+%d more)", first, n - 1; else printf "%s", first }'
}

start_all=$SECONDS

# Baseline: the selected tests must pass on the unmutated copy, or "killed" would mean nothing.
if ((baseline)); then
  all_targets=()
  regexes=()
  for n in "${names[@]}"; do
    p="$mutations_dir/$n.patch"
    read -ra t <<<"$(header "$p" targets)"
    all_targets+=("${t[@]}")
  done
  mapfile -t all_targets < <(printf '%s\n' "${all_targets[@]}" | sort -u)
  echo "== baseline: building ${#all_targets[@]} targets"
  if ! run_waiting ninja -C "$build" -j "$jobs" "${all_targets[@]}" >"$scratch/baseline-build.log" 2>&1; then
    tail -40 "$scratch/baseline-build.log" >&2
    echo "run.sh: the unmutated tree does not build" >&2
    exit 1
  fi
  declare -A seen=()  # several mutations share a selection: run each once
  for n in "${names[@]}"; do
    p="$mutations_dir/$n.patch"
    [[ -z "${seen["$(header "$p" tests)"]:-}" ]] || continue
    seen["$(header "$p" tests)"]=1
    read -ra sel <<<"$(header "$p" tests)"
    rc=0
    run_tests "$scratch/baseline-$n.log" "$(header "$p" timeout | grep . || echo 300)" \
      "${sel[@]}" || rc=$?
    if ((rc == 3)); then
      echo "run.sh: $n: '# tests: ${sel[*]}' matches no test" >&2
      exit 1
    elif ((rc != 0)); then
      tail -40 "$scratch/baseline-$n.log" >&2
      echo "run.sh: baseline failed for $n's selection (${sel[*]}): $(failed_tests "$scratch/baseline-$n.log")" >&2
      exit 1
    fi
  done
  echo "== baseline passed ($((SECONDS - start_all)) s)"
fi

results=()  # "name|area|targets|result|seconds|detail"
bad=0
for n in "${names[@]}"; do
  p="$mutations_dir/$n.patch"
  area="$(header "$p" area)"
  read -ra targets <<<"$(header "$p" targets)"
  read -ra sel <<<"$(header "$p" tests)"
  timeout="$(header "$p" timeout)"
  timeout="${timeout:-300}"
  log="$scratch/$n.log"
  t0=$SECONDS
  detail=""
  if ! (cd "$src" && git apply "$p") >"$log" 2>&1; then
    result="NOT APPLIED"
    detail="$(head -1 "$log")"
    bad=1
  else
    if ! run_waiting ninja -C "$build" -j "$jobs" "${targets[@]}" >>"$log" 2>&1; then
      result="killed (build)"
      detail="$(grep -m1 'error:' "$log" | sed 's|^.*/src/||' | cut -c1-100 || true)"
    else
      rc=0
      run_tests "$log.ctest" "$timeout" "${sel[@]}" || rc=$?
      cat "$log.ctest" >>"$log"
      if ((rc == 3)); then
        result="NO TESTS"
        bad=1
      elif ((rc != 0)); then
        result="KILLED"
        detail="$(failed_tests "$log.ctest")"
      else
        result="SURVIVED"
        bad=1
      fi
    fi
    # Revert, and make sure it took: the next mutation must start from the pristine copy.
    if ! (cd "$src" && git apply -R "$p" && git apply --check "$p") >>"$log" 2>&1; then
      echo "run.sh: could not revert $n; stopping" >&2
      exit 1
    fi
  fi
  secs=$((SECONDS - t0))
  printf '%-36s %-15s %4ss  %s\n' "$n" "$result" "$secs" "$detail"
  if [[ "$result" == SURVIVED || "$result" == "NO TESTS" ]]; then
    tail -15 "$log" | sed 's/^/    /'
  fi
  results+=("$n|$area|${targets[*]}|$result|$secs|$detail")
done

total=$((SECONDS - start_all))
echo
# A Markdown table, so a run's output can be pasted into tests/README.md as it is.
row='| %-36s | %-7s | %-50s | %-14s | %4s | %s |\n'
printf "$row" mutation area targets result s "killed by (first failing test) or error"
printf "$row" "$(printf -- '-%.0s' {1..36})" "-------" "$(printf -- '-%.0s' {1..50})" \
  "$(printf -- '-%.0s' {1..14})" "---:" "---"
killed=0 survived=0 build_killed=0 not_applied=0 no_tests=0 survivors=()
for r in "${results[@]}"; do
  IFS='|' read -r n area targets result secs detail <<<"$r"
  printf "$row" "$n" "$area" "${targets// /, }" "$result" "$secs" "$detail"
  case "$result" in
    KILLED) killed=$((killed + 1)) ;;
    "killed (build)") build_killed=$((build_killed + 1)) ;;
    SURVIVED) survived=$((survived + 1)); survivors+=("\"$n\"") ;;
    "NOT APPLIED") not_applied=$((not_applied + 1)); survivors+=("\"$n\"") ;;
    *) no_tests=$((no_tests + 1)); survivors+=("\"$n\"") ;;
  esac
done
echo
printf '{"mutations": %d, "killed": %d, "killed_build": %d, "survived": %d, "not_applied": %d, "no_tests": %d, "seconds": %d, "source": "%s", "failing": [%s]}\n' \
  "${#results[@]}" "$killed" "$build_killed" "$survived" "$not_applied" "$no_tests" "$total" \
  "$source_desc" "$(IFS=,; echo "${survivors[*]}")"
exit "$bad"
