#!/usr/bin/env bash
# Fetches Hugging Face's tokenizers library into data/hf_tokenizers/ for the
# test that loads an export's tokenizer.json with it (tests/cli/hf_tokenizer.sh,
# ATTNRES_TEST_PART=tokenizers): the npm package tokenizers 0.23.2 (Apache-2.0),
# Hugging Face's Rust tokenizers (the library transformers' fast tokenizers
# run) with its prebuilt napi binaries, checked against its pinned SHA-256 by
# scripts/npm_package.sh. Only what loads it on x86-64 Linux (glibc) is kept:
# index.js (it picks the binary for the platform), package.json, LICENSE and
# tokenizers.linux-x64-gnu.node; each is checked against its pinned SHA-256,
# here and on reuse. Elsewhere the test reports itself skipped.
# Idempotent: does nothing when the files are there and match.
#   scripts/fetch_hf_tokenizers.sh
set -euo pipefail
cd "$(dirname "$0")/.."
out=data/hf_tokenizers
version=0.23.2
check() {
  sha256sum -c --quiet --status - <<SUMS
29e235c1fa5687362098d77253c1da21f35730014dce59e5639b76aca719f305  $1/index.js
e224d20d7f22bd17340b5d66e238c6893fe5813185d82a9861310167373747e8  $1/package.json
02965ed67e29f871a53f7a7afa593a0ddc8020f86ccce0faaf1aa59215b5269e  $1/LICENSE
ab404a79cff268a91e6800d55bc13587af67ea767441ab86fa9ee48f3e2dd961  $1/tokenizers.linux-x64-gnu.node
SUMS
}
if check "$out" 2>/dev/null; then exit 0; fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
scripts/npm_package.sh tokenizers "$version" \
  d5196036d6e7ef5934659618ef8f911080bf95f6ba6a2e42c243196a0ea50bc4 "$tmp/pkg"
# Staged beside the final place and moved in whole: an interrupted fetch
# leaves no half-written data/hf_tokenizers/.
mkdir -p data
rm -rf "$out" "$out.tmp"
mkdir "$out.tmp"
cp "$tmp"/pkg/{index.js,package.json,LICENSE,tokenizers.linux-x64-gnu.node} "$out.tmp/"
check "$out.tmp" || { echo "fetch_hf_tokenizers.sh: tokenizers@$version's files differ from the pinned ones" >&2; exit 1; }
mv "$out.tmp" "$out"
echo "==> $out: $(ls "$out" | tr '\n' ' ')"
