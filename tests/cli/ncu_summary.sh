#!/usr/bin/env bash
# scripts/ncu_summary.py on Nsight Compute CSVs written the way
# scripts/gpu_profile.sh asks for them (raw page, a units row, ==PROF== lines
# mixed in): kernels grouped by function (every cuBLAS GEMM as one group),
# times per step in the units the file gives, a mode's time over the
# baseline's, the step's time outside kernels, DRAM bandwidth per group.
# Usage: ncu_summary.sh BIN SRC (BIN unused: the script is Python)
source "$(dirname "$0")/lib.sh"

head='"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size","Device","CC","dram__bytes.sum","gpu__time_duration.sum"'
units='"","","","","","","","","","","","Mbyte","usecond"'
row() { echo "\"$1\",\"7\",\"attnres\",\"h\",\"$2\",\"1\",\"13\",\"(256, 1, 1)\",\"(132, 1, 1)\",\"0\",\"9.0\",\"$3\",\"$4\""; }
{
  echo "==PROF== Connected to process 7"
  echo "$head"; echo "$units"
  row 0 "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64" 10 100
  row 1 "rmsnorm_forward_kernel" 2 20
  row 2 "nvjet_hsh_128x256_64x4_2x1_v_bz_coopA_NNT" 10 300   # a cuBLAS kernel without "gemm"
  row 3 "rmsnorm_forward_kernel" 2 20
  echo "==PROF== Disconnected from process 7"
} > base.csv
{
  echo "$head"; echo "$units"
  row 0 "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64" 10 100
  row 1 "rmsnorm_forward_kernel" 2 20
  row 2 "mix_phase1_forward_kernel" 6 "1,000.5"
  row 3 "rmsnorm_forward_kernel" 2 20
} > block.csv
out=$(python3 "$SRC/scripts/ncu_summary.py" --steps 2 --step-ms baseline=0.5 --step-ms block=1.0 \
      baseline=base.csv block=block.csv)
echo "$out"
expect() { grep -qF -- "$1" <<<"$out" || fail "output lacks: $1"; }
# 2 steps: per-step halves. GEMMs 100 us (+ 300 us of nvjet in the baseline file, a cuBLAS
# kernel name without "gemm"), so the baseline's GEMM group is 0.200 ms/step.
expect "| GEMM (cuBLASLt) | 0.200 | 1 | 0.050 | 0.5 | -0.150 |"
expect "| mix_phase1_forward_kernel | 0.000 | 0 | 0.500 | 0.5 | +0.500 |"
expect "| rmsnorm_forward_kernel | 0.020 | 1 | 0.020 | 1 | +0.000 |"
expect "| **all kernels** | **0.220** | 2 | **0.570** | 2 | +0.350 |"
expect "| baseline | 0.500 | 0.220 | 0.280 | 56.0% |"
expect "| mix_phase1_forward_kernel | block | 0.500 | 3.0 | 6 |"
pass "groups, units, per-step times, deltas over the baseline, gaps and bandwidth"

echo '"ID","Kernel Name"' > bad.csv
python3 "$SRC/scripts/ncu_summary.py" x=bad.csv 2>err.txt && fail "a CSV without times was accepted"
grep -q "no 'Kernel Name' or 'gpu__time_duration.sum' column" err.txt || { cat err.txt; fail "unclear error"; }
pass "a CSV without the time column is refused with its name"
