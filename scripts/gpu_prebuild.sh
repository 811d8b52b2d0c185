#!/usr/bin/env bash
# Builds the GPU binaries on the CPU machine (it has the CUDA toolkit, no GPU)
# so that a lent GPU's first command builds nothing: attnres, test_gpu and
# test_mpi for sm_90, host code without -march=native (the GPU machine's CPU
# may lack this one's instructions), stripped, packed with this tree's stamp
# (scripts/gpu_lib.sh tree_stamp) into .gpu-prebuilt.tar.xz, which the device
# tool carries beside .deps and .shards (64 MiB in all). On the device,
# scripts/gpu_check.sh's binaries step unpacks them when the stamp is that
# tree's and ldd finds every library; else it builds there.
#   scripts/gpu_prebuild.sh      (build folder: build-gpu-prebuilt/, kept for the next run)
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu_lib.sh
dir=build-gpu-prebuilt
export CCACHE_BASEDIR="$PWD"
cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=Release -DATTNRES_CUDA=ON -DATTNRES_NATIVE=OFF \
  -DCMAKE_CUDA_ARCHITECTURES=90 > /dev/null
grep -q "ATTNRES_HAVE_CUDA:INTERNAL=1\|ATTNRES_HAVE_CUDA=1" "$dir/CMakeCache.txt" 2>/dev/null \
  || grep -q "nvcc" "$dir/CMakeCache.txt" \
  || { echo "error: no CUDA toolkit found (/usr/local/cuda): nothing to prebuild" >&2; exit 1; }
cmake --build "$dir" -j"$(nproc)" --target attnres test_gpu test_mpi
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/tests"
for b in "${GPU_BINARIES[@]}"; do
  cp "$dir/$b" "$stage/$b"
  strip --strip-unneeded "$stage/$b"
done
tree_stamp > "$stage/stamp.txt"
tar cJf .gpu-prebuilt.tar.xz.part -C "$stage" stamp.txt "${GPU_BINARIES[@]}"
mv .gpu-prebuilt.tar.xz.part .gpu-prebuilt.tar.xz
echo "the binaries (stripped), packed into .gpu-prebuilt.tar.xz:"
(cd "$stage" && du -b "${GPU_BINARIES[@]}")
du -b .gpu-prebuilt.tar.xz
carried=0
for f in .deps .shards .gpu-prebuilt.tar.xz; do
  [[ -e $f ]] && carried=$((carried + $(du -sb "$f" | cut -f1)))
done
echo "carried in all (.deps, .shards, .gpu-prebuilt.tar.xz): $((carried / 1048576)) MiB of 64"
((carried <= 64 * 1048576)) || { echo "error: more than the device tool's 64 MiB" >&2; exit 1; }
