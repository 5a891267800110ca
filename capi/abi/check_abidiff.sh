#!/bin/sh
# ABI guard 2/2: abidiff of the committed ABI baseline against the built library.
#
#   check_abidiff.sh <libchunkserve.so> <libchunkserve.abi> <compatible_changes.abignore>
#
# Policy (capi/README.md): compatible additions pass, everything else fails.
#  - Added functions (--no-added-syms) and fields appended to the end of a versioned struct
#    (compatible_changes.abignore) are filtered out: they are what the ABI rules allow.
#  - abidiff's exit status is a bit set: 1 tool error, 2 usage error, 4 ABI change, 8 incompatible
#    ABI change (e.g. a removed function). After the filtering above any remaining change (4) is a
#    changed parameter, return or field type of an existing interface, so 4 fails as well as 8.
#  - The suppression also hides a same-size reordering of fields (a libabigail quirk), so when the
#    filtered run is clean, the unfiltered report is searched for moved / changed / removed fields.
set -u
lib=$1
baseline=$2
suppressions=$3
abidiff --exported-interfaces-only --no-added-syms --suppressions "$suppressions" \
        "$baseline" "$lib"
rc=$?
if [ "$rc" -eq 0 ]; then
  # libabigail 2.2's has_data_member_inserted_at=end suppression also hides a same-size field
  # reordering, so look at the unsuppressed report for changes to existing fields as well.
  moved=$(abidiff --exported-interfaces-only --no-added-syms "$baseline" "$lib" |
          grep -E "offset changed|data member deletion|data members? change" || true)
  if [ -n "$moved" ]; then
    echo "$moved"
    echo "check_abidiff: existing struct fields moved, changed or were removed (see above)."
    echo "Fields may only be appended to the end of a versioned struct."
    exit 1
  fi
  echo "check_abidiff: no ABI change against $baseline beyond allowed additions"
  exit 0
fi
if [ $((rc & 3)) -ne 0 ]; then
  echo "check_abidiff: abidiff failed to run (exit status $rc)"
  exit 1
fi
if [ $((rc & 8)) -ne 0 ]; then
  echo "check_abidiff: INCOMPATIBLE ABI change (exit status $rc): see the report above."
else
  echo "check_abidiff: ABI change to an existing interface (exit status $rc): see the report above."
fi
echo "Existing functions and struct fields must keep their types and layout; only append."
echo "An intended break needs CHUNKSERVE_ABI_VERSION bumped and the baseline refreshed."
exit 1
