#!/bin/sh
# Build-tree programs load no library from the current directory: a tool
# or the torch extension started in a directory holding a file named like
# one of its libraries (a shared /tmp, a download folder) must not run it.
# Every library the program names (but the C library, which the planted
# twins need themselves) gets a twin here whose constructor announces
# itself and exits 66.
# Usage: no_cwd_libraries.sh CC TOOL... [-- PYTHON EXTENSION PYTHONPATH]
set -eu
cc=$1
shift
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
plant() {  # the libraries $1 names, planted in $dir
  for soname in $(readelf -d "$1" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'); do
    case $soname in libc.so.*) continue ;; esac
    [ -e "$dir/$soname" ] && continue
    printf '%s\n' '#include <stdio.h>' '#include <unistd.h>' \
      "__attribute__((constructor)) static void planted(void) {" \
      "  fprintf(stderr, \"planted $soname was loaded\\n\"); _exit(66); }" > "$dir/planted.c"
    "$cc" -x c -shared -fPIC -Wl,-soname,"$soname" -o "$dir/$soname" "$dir/planted.c"
  done
}
fail() { echo "no_cwd_libraries: $*" >&2; exit 1; }
# An empty or relative RUNPATH element is the current directory's: every
# element must be absolute or start at $ORIGIN. (For the extension this is
# the check that bites: the libraries it names are loaded by `import torch`
# before it, so the run below finds no planted twin to load.)
runpath() {
  rp=$(readelf -d "$1" | sed -n 's/.*(R[UN]*PATH).*\[\(.*\)\]/\1/p')
  [ -n "$rp" ] || return 0
  case ":$rp:" in *::*) fail "$1 has an empty RUNPATH element (the current directory): $rp" ;; esac
  old=$IFS IFS=:
  for element in $rp; do
    case $element in /* | '$ORIGIN' | '$ORIGIN/'*) ;; *) fail "$1 has a relative RUNPATH element '$element': $rp" ;; esac
  done
  IFS=$old
}
checked=0
while [ $# -gt 0 ] && [ "$1" != -- ]; do
  runpath "$1"
  plant "$1"
  (cd "$dir" && "$1" --version) > "$dir/out" 2>&1 ||
    fail "$1 --version in a directory of planted libraries: $(tail -n 3 "$dir/out")"
  checked=$((checked + 1))
  shift
done
if [ $# -gt 0 ]; then
  python=$2 extension=$3 path=$4
  runpath "$extension"
  plant "$extension"
  (cd "$dir" && PYTHONPATH="$path" "$python" -c 'import rdmacc_torch') > "$dir/out" 2>&1 ||
    fail "import rdmacc_torch in a directory of planted libraries: $(tail -n 3 "$dir/out")"
  checked=$((checked + 1))
fi
[ "$checked" -gt 0 ] || fail "nothing to check"
echo "no_cwd_libraries: $checked programs load nothing from the current directory"
