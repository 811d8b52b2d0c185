#!/usr/bin/env bash
# scripts/gpu_report.py on a made-up session folder: a test log with its
# success line is "passed", one with a FAIL line or without its last line
# "FAILED", a missing log "not run", a run that found no device or no NCCL
# "skipped" (not "passed"); the GPU tests split into runs by
# scripts/gpu_check.sh a row each; the ok / FAIL lines of the multi-rank
# scripts are quoted; the target table comes from the bench reports (here the
# H100 run kept in docs/measurements).
# Usage: gpu_report.sh BIN SRC (BIN unused: the script is Python)
source "$(dirname "$0")/lib.sh"
expect() { grep -qF -- "$1" <<<"$out" || fail "output lacks: $1"; }

mkdir s
cp "$SRC"/docs/measurements/2026-11-22-h100-2/{gpu.txt,bench_124m.txt,kernels_124m.txt,attention_torch.txt} s/
printf 'GPU tests on NVIDIA H100\nAll tests passed (12 assertions in 3 test cases)\n' > s/gpu_tests.log
printf 'test cases: 2 | 1 passed | 1 failed\n' > s/nccl.log
printf 'ok: one\nok: two\nall resume checks passed\n' > s/resume.log
printf 'ok: fp32, 2 ranks, final loss 7.1\nFAIL: bf16 --parallel.data=2: losses differ\n' > s/pipeline_cuda.log
printf 'ok: zero = 1 = zero = 0\n' > s/zero_bf16.log  # cut off before its last line
printf 'final val loss (step 400): fp32_s1 5.0\n' > s/logits_compare.txt
out=$($PY "$SRC/scripts/gpu_report.py" s --commit abc1234 --date 2026-11-25)
echo "$out"
expect "Commit abc1234; GPU: NVIDIA H100 80GB HBM3"
expect "| GPU tests (\`test_gpu\`) | passed | All tests passed (12 assertions in 3 test cases) (GPU tests on NVIDIA H100) |"
expect "| NCCL transport, 1 rank (\`test_mpi [nccl]\`) | FAILED | test cases: 2 | 1 passed | 1 failed |"
expect "| exact resume and eval, bf16 (\`tests/cli/resume.sh\`) | passed | 2 lines below |"
expect "| pipeline and data parallelism on cuda (\`tests/gpu/pipeline_cuda.sh\`) | FAILED | 2 lines below |"
expect "| ZeRO-1 in bf16, 2 ranks (\`tests/gpu/zero_bf16.sh\`) | FAILED | 1 line below |"
expect "FAIL: bf16 --parallel.data=2: losses differ"
expect "| 124M baseline MFU | 34.0% | >= 40% | issue | no |"
expect "final val loss (step 400): fp32_s1 5.0"
[[ $(grep -c "^not run$" <<<"$out") -eq 1 ]] || fail "the profiles should be 'not run'"

# Skips: Catch2 passes a test case that only warned; a script that skipped.
printf 'warning:\n  skipped: this build has no NCCL transport (needs CUDA + NCCL + MPI)\n\nAll tests passed (0 assertions in 1 test case)\n' > s/nccl.log
printf 'skipped: no CUDA device visible\n' > s/zero_bf16.log
out=$($PY "$SRC/scripts/gpu_report.py" s --commit abc1234 --date 2026-11-25)
expect "| NCCL transport, 1 rank (\`test_mpi [nccl]\`) | skipped | skipped: this build has no NCCL transport (needs CUDA + NCCL + MPI) |"
expect "| ZeRO-1 in bf16, 2 ranks (\`tests/gpu/zero_bf16.sh\`) | skipped | 1 line below |"
# scripts/gpu_check.sh's stages: the GPU tests in runs of their own, each a
# row (gpu_tests.log, kept beside them from an earlier run, a row too); a spec
# that matched nothing (-w NoTests) FAILED; steps.txt quoted.
printf 'GPU tests on NVIDIA H100\nAll tests passed (40 assertions in 9 test cases)\n' > s/gpu_tests_ce_swiglu_store.log
printf 'GPU tests on NVIDIA H100\ntest cases: 6 | 5 passed | 1 failed\n' > s/gpu_tests_model.log
printf 'GPU tests on NVIDIA H100\nNo test cases matched '"'"'[recompute]'"'"'\n' > s/gpu_tests_recompute.log
printf 'tests   gpu_tests_model.log            FAILED       41 s  (expected 0.5 min)\n' > s/steps.txt
out=$($PY "$SRC/scripts/gpu_report.py" s --commit abc1234 --date 2026-11-25)
expect '| GPU tests `"[cross_entropy],[swiglu],[store]"` | passed | All tests passed (40 assertions in 9 test cases) (GPU tests on NVIDIA H100) |'
expect '| GPU tests `"[model]"` | FAILED | test cases: 6 | 5 passed | 1 failed (GPU tests on NVIDIA H100) |'
expect '| GPU tests: the rest | not run | |'
expect '| GPU tests `"[recompute]"` (recomputation bit for bit) | FAILED | No test cases matched '"'"'[recompute]'"'"' (GPU tests on NVIDIA H100) |'
expect "| GPU tests (\`test_gpu\`) | passed |"
expect "tests   gpu_tests_model.log            FAILED       41 s  (expected 0.5 min)"
rm s/gpu_tests.log
out=$($PY "$SRC/scripts/gpu_report.py" s --commit abc1234 --date 2026-11-25)
grep -qF "| GPU tests (\`test_gpu\`)" <<<"$out" && fail "a missing gpu_tests.log beside the split logs should have no row"
# Catch2 under mpirun colours its summary (2026-11-26's nccl.log): still a pass.
printf '\033[1;32m===\033[0m\n\033[1;32mAll tests passed\033[0m (66 assertions in 3 test cases)\n' > s/nccl.log
printf 'GPU tests on NVIDIA H200\nAll tests passed (176 assertions in 5 test cases)\n' > s/gpu_tests_matmul.log
out=$($PY "$SRC/scripts/gpu_report.py" s --commit abc1234 --date 2026-11-25)
expect "| NCCL transport, 1 rank (\`test_mpi [nccl]\`) | passed | All tests passed (66 assertions in 3 test cases) |"
expect '| GPU tests `"[matmul]"` (cuBLASLt plans logged) | passed | All tests passed (176 assertions in 5 test cases) (GPU tests on NVIDIA H200) |'
printf 'SKIPPED: no CUDA device found; GPU tests were NOT run.\n' > s/gpu_tests_rest.log
out=$($PY "$SRC/scripts/gpu_report.py" s --commit abc1234 --date 2026-11-25)
expect '| GPU tests: the rest | skipped | SKIPPED: no CUDA device found; GPU tests were NOT run. |'
pass "gpu_report.py"
