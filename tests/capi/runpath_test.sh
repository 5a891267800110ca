#!/bin/sh
# No built or installed ELF file may carry an empty or relative RUNPATH/RPATH entry: the loader
# reads an empty entry as the current directory and a relative one against it, so a library
# planted where an embedding program runs would be loaded into it.
#
#   runpath_test.sh <file or directory>...
set -eu
bad=0
checked=0
for root in "$@"; do
  for f in $(find "$root" -type f \( -name '*.so*' -o -perm -u+x \) 2>/dev/null); do
    head -c 4 "$f" 2>/dev/null | grep -q 'ELF' || continue
    checked=$((checked + 1))
    paths=$(readelf -d "$f" 2>/dev/null | sed -n 's/.*(R\(UN\)\{0,1\}PATH).*\[\(.*\)\]/\2/p')
    [ -n "$paths" ] || continue
    # Entries split on ':'; a leading, trailing or doubled ':' is an empty entry.
    case ":$paths:" in *::*) echo "runpath_test: $f: empty entry in [$paths]"; bad=1; continue;; esac
    old_ifs=$IFS; IFS=:
    for entry in $paths; do
      case "$entry" in
        /*|'$ORIGIN'*) ;;
        *) echo "runpath_test: $f: relative entry '$entry' in [$paths]"; bad=1;;
      esac
    done
    IFS=$old_ifs
  done
done
echo "runpath_test: $checked ELF files checked"
[ "$checked" -gt 0 ] || { echo "runpath_test: nothing to check"; exit 1; }
exit $bad
