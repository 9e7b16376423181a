#!/bin/sh
# Install directories given as absolute paths (GNUInstallDirs allows them;
# Fedora's %cmake passes CMAKE_INSTALL_LIBDIR=/usr/lib64) install where they
# say, and what is installed finds librdmacc there: the tools' and the torch
# extension's RUNPATH lead from their directory to the library directory, and
# rdmacc.pc names it. Only a configure (no build): its install script and .pc
# file are checked, which is where a prefix joined to an absolute directory
# (/usr//usr/bin) would show.
# Usage: absolute_install_dirs.sh CMAKE SOURCE_DIR
set -eu
cmake=$1
source=$2
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fail() { echo "absolute_install_dirs: $*" >&2; exit 1; }
"$cmake" -S "$source" -B "$dir" -DRDMACC_BUILD_TESTS=OFF -DCMAKE_INSTALL_PREFIX=/usr \
  -DCMAKE_INSTALL_BINDIR=/usr/bin -DCMAKE_INSTALL_LIBDIR=/usr/lib64 \
  -DCMAKE_INSTALL_INCLUDEDIR=/usr/include \
  -DRDMACC_PYTHON_INSTALL_DIR=/usr/lib/python3/dist-packages > "$dir/configure.log" 2>&1 ||
  { cat "$dir/configure.log" >&2; fail "configure failed"; }
# Each file(RPATH_CHANGE) of the install scripts: "FILE<tab>NEW_RPATH" per line.
changes() {
  tr '\n' ' ' < "$1" |
    grep -o 'file(RPATH_CHANGE *FILE "[^"]*" *OLD_RPATH "[^"]*" *NEW_RPATH "[^"]*")' |
    sed 's/.*FILE "\([^"]*\)".*NEW_RPATH "\([^"]*\)")/\1\t\2/'
}
want() {  # FILE RUNPATH: the install script sets FILE's RUNPATH to RUNPATH
  grep -qxF "$1	$2" "$dir/changes" ||
    fail "no RUNPATH change of $1 to $2 in the install scripts; they have:
$(cat "$dir/changes")"
}
find "$dir" -name cmake_install.cmake -exec cat {} + > "$dir/install.cmake"
changes "$dir/install.cmake" > "$dir/changes"
for tool in rdmacc-info rdmacc-run rdmacc-perf rdmacc-tune; do
  want "\$ENV{DESTDIR}/usr/bin/$tool" '$ORIGIN/../lib64'
done
if grep -q rdmacc_torch_ext "$dir/install.cmake"; then  # Torch was found
  module=$(sed -n 's/.*FILE "\(.*rdmacc_torch\/_C[^"]*\)"$/\1/p' "$dir/install.cmake")
  [ -n "$module" ] || fail "the torch extension's RUNPATH is not set at install"
  want "$module" '$ORIGIN/../../../../lib64'
  case $module in
    '$ENV{DESTDIR}/usr/lib/python3/dist-packages/rdmacc_torch/'*) ;;
    *) fail "the torch extension installs to $module" ;;
  esac
fi
grep -qx 'libdir=/usr/lib64' "$dir/rdmacc.pc" && grep -qx 'includedir=/usr/include' "$dir/rdmacc.pc" ||
  fail "rdmacc.pc names another directory: $(grep dir= "$dir/rdmacc.pc")"
echo "absolute install directories: RUNPATHs and rdmacc.pc lead to /usr/lib64"
