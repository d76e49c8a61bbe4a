#!/usr/bin/env bash
# Fetch ONNX Runtime's C/C++ API headers from Debian 13 (trixie)'s libonnxruntime-dev package into DEST,
# with a private apt state folder: nothing is installed and the machine's apt sources are untouched.
# Usage: fetch_ort_headers.sh DEST   (DEST/onnxruntime_c_api.h exists afterwards)
set -euo pipefail
dest=${1:?usage: fetch_ort_headers.sh DEST}
[ -f "$dest/onnxruntime_c_api.h" ] && exit 0
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/lists/partial" "$work/cache/archives/partial"
echo 'deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian trixie main' \
  > "$work/sources.list"
o="-oDir::Etc::SourceList=$work/sources.list -oDir::Etc::SourceParts=/dev/null -oDir::State::Lists=$work/lists"
o="$o -oDir::Cache=$work/cache -oAPT::Sandbox::User=root -oDebug::NoLocking=1"
apt-get $o -qq update
(cd "$work" && apt-get $o -qq download libonnxruntime-dev)
dpkg -x "$work"/libonnxruntime-dev_*.deb "$work/deb"
mkdir -p "$(dirname "$dest")"
rm -rf "$dest"
cp -r "$work/deb/usr/include/onnxruntime" "$dest"
echo "ONNX Runtime headers from Debian's libonnxruntime-dev in $dest"
