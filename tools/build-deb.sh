#!/usr/bin/env bash
# Builds uroce's Debian package with Debian's own tools (dpkg-buildpackage;
# debhelper's dh with its meson build system) from a clean copy of the
# tree: the files git tracks, nothing built, with tools/debian as debian/
# (the repository's top level stays as it is).
#   tools/build-deb.sh [OUT_DIR]     (default: deb-out; the .deb lands there)
# Needs the build dependencies in tools/debian/control (tools/setup.sh
# installs them) and git.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-deb-out}
mkdir -p "$out"
out=$(cd "$out" && pwd)
version=$(sed -n "s/^ *version : '\(.*\)',*$/\1/p" "$here/meson.build" | head -1)
[ -n "$version" ] || { echo "build-deb: no version in meson.build" >&2; exit 2; }
work=$(mktemp -d /tmp/uroce-deb.XXXXXX)
trap 'rm -rf "$work"' EXIT
src="$work/uroce-$version"
mkdir -p "$src"
(cd "$here" && git ls-files -z | xargs -0 cp -a --parents -t "$src")
cp -a "$here/tools/debian" "$src/debian"
echo "== dpkg-buildpackage: uroce $version in $src"
(cd "$src" && DEB_BUILD_OPTIONS="nocheck parallel=$(nproc)" dpkg-buildpackage -us -uc -b) > "$work/build.log" 2>&1 || {
  tail -40 "$work/build.log"; echo "build-deb: dpkg-buildpackage failed" >&2; exit 1; }
grep -E '^dpkg-deb: building' "$work/build.log" || true
mv "$work"/*.deb "$out"/
ls "$out"/*.deb
