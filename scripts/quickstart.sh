#!/usr/bin/env bash
# From a fresh clone: install, build, prepare the Brown corpus, train a small
# Block AttnRes model on the CPU for a few minutes, evaluate it and sample from it.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install_deps.sh train corpus   # what training needs (the tests' packages: scripts/test.sh)
scripts/build.sh --target attnres   # the tests are built by scripts/test.sh
scripts/prepare_brown.sh 4096

cfg=configs/quickstart.json
ckpt=ckpt/quickstart
# Re-running the quickstart starts over rather than refusing a used checkpoint dir.
rm -rf "$ckpt" runs/quickstart
echo "==> training (Block AttnRes, $(grep -o '"steps": [0-9]*' $cfg) on $(nproc) cores)"
build/attnres train "$cfg" "$@"

final=$(ls -d "$ckpt"/step_* | sort | tail -1)
echo "==> evaluating $final"
build/attnres eval --checkpoint "$final" --data 'data/brown/brown_val_*.bin' --batches 8
echo "==> sample"
build/attnres generate --checkpoint "$final" --prompt "The jury said" --tokens 60 --seed 1
