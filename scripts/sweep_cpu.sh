#!/usr/bin/env bash
# From a fresh clone: install, build, prepare the Brown corpus, run the CPU
# scaling-law sweep (configs/sweeps/cpu_small.json: 27 runs, about an hour
# on 2 cores) and write sweeps/cpu_small/{results.csv,fits.json,plots/*.png}.
# Run it again to resume an interrupted sweep (completed runs are skipped).
# Extra arguments go to `attnres sweep`, e.g. --no-plots or --dry-run.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install_deps.sh train corpus figures
scripts/build.sh --target attnres
scripts/prepare_brown.sh 4096
build/attnres sweep configs/sweeps/cpu_small.json "$@"
