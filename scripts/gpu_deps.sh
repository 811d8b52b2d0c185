#!/usr/bin/env bash
# Downloads (does not install) the Debian packages that the CPU side of the
# build needs into .deps/, for a GPU machine without network access:
# scripts/gpu_check.sh unpacks them there when the system lacks them.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .deps
cd .deps
apt-get download nlohmann-json3-dev libspdlog-dev libspdlog1.10 libfmt-dev libfmt9 catch2 \
  libpcre2-dev libpcre2-8-0 libpcre2-16-0 libpcre2-32-0 libpcre2-posix3 pkgconf pkgconf-bin libpkgconf3 \
  libopenblas-openmp-dev libopenblas0-openmp libopenblas-dev libgfortran5 libquadmath0
ls -la
