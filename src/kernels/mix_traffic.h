// The bytes each AttnRes Mix kernel (kernels/mix.h) must move: every input
// read once and every output written once, an accumulated output (+=) read
// and written, from the shapes alone. It is the kernels' own traffic floor:
// time >= bytes / copy bandwidth. `attnres bench --kernels` prints it beside
// each Mix row's time (its "MB" column, and "of floor" = the achieved fraction
// of the measured copy bandwidth); scripts/gpu_targets.py holds each row to
// 1.3x of it. What it does not count, by design: a kernel's re-reads (a source
// read again for dw, a row re-read from L2 per query) and the zero fill of a
// buffer a kernel then overwrites; those are what a kernel loses to its floor.
#pragma once
#include <cstdint>

#include "core/tensor.h"

namespace attnres::kernels {

struct Traffic {
  double read = 0, written = 0;  // bytes
  double total() const { return read + written; }
};

// Element sizes, in bytes: activations (sources, outputs, queries w, gains and
// the sources' gradients), statistics (rstd, softmax weights, lse, the merge's
// saved stats: kernels/common.h's stat_dtype) and parameter gradients (dw,
// dgain: grad_dtype).
struct MixBytes {
  double act = 0, stat = 0, grad = 0;
  static MixBytes of(DType activations);
};

// Phase 1 (and the single-query Mix): Q queries over k sources of [N, d].
// lse: the forward writes each query's lse [Q, N] and the backward reads its
// gradient (a group whose sublayers merge with recent sources).
struct MixQueries {
  int64_t rows = 0, d = 0, sources = 0, queries = 1;
  bool lse = false;
};

// The phase-2 merge with m recent sources, fused with the RMSNorm after it.
struct MixMerge {
  int64_t rows = 0, d = 0, recent = 1;
};

// rstd [N] of a source [N, d].
Traffic mix_source_rstd_traffic(int64_t rows, int64_t d, const MixBytes& b);
// Reads the sources, their rstds and the queries; writes the outputs, the
// softmax weights [Q, N, k] and lse.
Traffic mix_forward_traffic(const MixQueries& s, const MixBytes& b);
// Reads the sources, rstds, queries, output gradients, softmax weights and
// dlse; the sources' gradients are running sums (+=: read and written) unless
// this call is known to be their first writer (accumulate = false: written
// only); dw accumulates.
Traffic mix_backward_traffic(const MixQueries& s, const MixBytes& b, bool accumulate = true);
// Reads o, lse, the recent sources, w and the gain; writes u and the stats
// [N, 2m + 2].
Traffic mix_merge_norm_forward_traffic(const MixMerge& s, const MixBytes& b);
// Reads du, o, the recent sources, the stats, w and the gain; writes d_o and
// dlse; the recent sources' gradients, dw and dgain accumulate.
Traffic mix_merge_norm_backward_traffic(const MixMerge& s, const MixBytes& b);

}  // namespace attnres::kernels
