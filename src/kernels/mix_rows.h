// The "rows" layout of the CUDA AttnRes Mix kernels (kernels/cuda/mix.cu and
// mix_merge_norm.cu; issue 40), as host arithmetic: which kernel family a
// call takes, how many threads, queries per launch and bytes of shared memory.
// It lives outside kernels/cuda so that the CPU tests check it
// (tests/kernels/test_mix_rows.cpp) and the kernels carve their shared memory
// with the same formulas.
//
// The layout: a thread block owns one token row at a time (rows strided over a
// grid of resident blocks), thread t the kEpt = 4 elements [4 t, 4 t + 4) of
// it: 8 bytes of bf16, one load per row, coalesced across the block. Every
// input row (a source, a query's dout, o, du, a recent source) is read from
// DRAM once per row pass; the queries' w (and dout) slots a thread needs for
// every source sit in shared memory, read back only by the thread that wrote
// them (no bank conflicts, no registers held); reductions are warp shuffles,
// then the warps' sums added in warp order (the same bits in every thread).
// The parameter gradients (dw, dgain) are summed in registers per thread over
// its block's rows and written as per-block partials, which
// launch_dw_reduce adds in a fixed order: no pass re-reads the sources for dw.
// Why 4 elements and not 8: a thread keeps one fp32 accumulator per element
// and query (phase 1's outputs forward, dw backward), kMaxQueries x kEpt = 32
// registers, which leaves the kernels within 64 registers (32 warps per SM).
// kEpt is fixed, not chosen per call, so a query's arithmetic does not depend
// on how many queries share its launch.
//
// The rows kernels take bf16 rows with d % 4 == 0, d <= 4096 and 8-byte
// aligned pointers (the training dtype on a GPU); everything else, and
// ATTNRES_MIX_KERNELS=warp, takes the warp kernels (a warp or a block of warps
// per row), kept until the rows kernels have run on a GPU.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

#include "core/hostdevice.h"

namespace attnres::kernels::mix_rows {

constexpr int kEpt = 4;                 // elements per thread
constexpr int kMaxThreads = 1024;       // so d <= 4096
constexpr int kMaxQueries = 8;          // phase-1 queries per launch
constexpr int kMaxRecent = 8;           // recent sources of a merge (Full: its group size - 1)
constexpr size_t kMaxSmem = 100 << 10;  // dynamic shared memory per block (opt-in above 48 KiB)

// Threads of a block for rows of d elements: ceil(d / kEpt), whole warps.
ATTNRES_HD int threads(int64_t d) {
  return static_cast<int>(((d + kEpt - 1) / kEpt + 31) / 32 * 32);
}

// Phase-1 shared memory of a block of G threads for Q queries over k sources,
// in bytes (offsets in the order listed; every part a multiple of 8 bytes or
// last):
// forward:  the w_q slots [Q][G] (8 bytes each); the warps' partial dots
//           [k][G/32][Q] floats; the logits, then the softmax weights, [Q][k].
// backward: the w_q and dout_q slots [2][Q][G]; the warps' partial dots
//           [k][G/32][2Q]; w_q . v_j then the coefficient of v_j, dout_q . v_j
//           then the coefficient of w_q, a_qj [3][Q][k]; r_j [k]; s_q [Q].
ATTNRES_HD size_t forward_smem(int Q, int k, int G) {
  return size_t(Q) * G * 8 + (size_t(k) * (G / 32) * Q + size_t(Q) * k) * 4;
}
ATTNRES_HD size_t backward_smem(int Q, int k, int G) {
  return 2 * size_t(Q) * G * 8 + (size_t(k) * (G / 32) * 2 * Q + 3 * size_t(Q) * k + k + Q) * 4;
}

// ATTNRES_MIX_KERNELS, read at every call (tests and the benchmark switch it):
// unset, empty or "rows": true (the rows kernels where they apply); "warp":
// false. Anything else throws, naming the variable.
bool rows_from_env();

struct Plan {
  bool rows = false;       // the rows kernels apply
  std::string why;         // when not: the reason
  int threads = 0;         // block size
  int queries = 0;         // queries per launch (phase 1; forward_smem / backward_smem of a
                           // launch of that many fit in kMaxSmem)
};

// What a phase-1 call of Q queries over k sources takes (forward or backward):
// bf16 and aligned (d % 4 == 0 and every pointer 8-byte aligned) are the
// caller's findings. Queries go in launches of at most kMaxQueries, fewer if
// shared memory needs it.
Plan plan_phase1(bool backward, bool bf16, bool aligned, int64_t d, int Q, int k);
// What a merge + norm call (forward and backward) with m recent sources takes.
Plan plan_merge(bool bf16, bool aligned, int64_t d, int m);

}  // namespace attnres::kernels::mix_rows
