// The Mix kernels' traffic floors (kernels/mix_traffic.h) against hand counts,
// tensor by tensor, at the shapes `attnres bench --preset 124m --kernels` times
// in bf16: B x T = 16 x 1024 = 16384 rows of d = 768; 24 sublayers.
//   Block AttnRes, N = 8 blocks of S = 3: phase 1 of the last block is Q = 3
//   queries over its k = 8 completed blocks; its merge has m = 1 recent source
//   (the partial sum); the final Mix reads k = 9 sources.
//   Full AttnRes, Mix groups of G = ceil(sqrt(24)) = 5: the last group starts
//   at sublayer 20, so phase 1 is Q = 4 queries over k = 21 sources, and its
//   largest merge (bench's row) has m = 4 recent sources.
// Sizes: a [16384, 768] bf16 row block is 25,165,824 B; a [16384] fp32
// statistic 65,536 B; a [768] bf16 vector 1,536 B, an fp32 one 3,072 B.
#include <catch2/catch.hpp>

#include "kernels/mix_traffic.h"

using namespace attnres;
using namespace attnres::kernels;

namespace {

constexpr double X = 25165824;  // [16384, 768] bf16
constexpr double S = 65536;     // [16384] fp32
constexpr double W = 1536;      // [768] bf16 (w, gain)
constexpr double G = 3072;      // [768] fp32 (dw, dgain)
const MixBytes bf16 = MixBytes::of(DType::BF16);

void check(const Traffic& t, double read, double written) {
  CHECK(t.read == read);
  CHECK(t.written == written);
}

}  // namespace

TEST_CASE("Mix traffic: the element sizes of each precision", "[mix_traffic]") {
  CHECK((bf16.act == 2 && bf16.stat == 4 && bf16.grad == 4));
  const MixBytes f32 = MixBytes::of(DType::F32), f64 = MixBytes::of(DType::F64);
  CHECK((f32.act == 4 && f32.stat == 4 && f32.grad == 4));
  CHECK((f64.act == 8 && f64.stat == 8 && f64.grad == 8));
}

TEST_CASE("Mix traffic = hand counts for Block AttnRes N = 8 at 124M (bf16)", "[mix_traffic]") {
  const int64_t N = 16384, d = 768;
  // Phase 1 forward: reads 8 sources, their 8 rstds, 3 queries; writes 3
  // outputs, the weights [3, 16384, 8] fp32 (8 S per query) and lse [3, 16384].
  check(mix_forward_traffic({N, d, 8, 3, true}, bf16), 8 * X + 8 * S + 3 * W,
        3 * X + 3 * 8 * S + 3 * S);
  // Phase 1 backward: reads the 8 sources, 8 rstds, 3 queries, 3 output
  // gradients, the weights, dlse [3, 16384], the 8 source gradients (+=) and
  // 3 dw (+=); writes the 8 source gradients and 3 dw.
  check(mix_backward_traffic({N, d, 8, 3, true}, bf16),
        8 * X + 8 * S + 3 * W + 3 * X + 3 * 8 * S + 3 * S + 8 * X + 3 * G, 8 * X + 3 * G);
  // The first writer of the source gradients reads none of them.
  check(mix_backward_traffic({N, d, 8, 3, true}, bf16, false),
        8 * X + 8 * S + 3 * W + 3 * X + 3 * 8 * S + 3 * S + 3 * G, 8 * X + 3 * G);
  // Merge + RMSNorm forward, m = 1: reads o, lse, the partial sum, w, gain;
  // writes u and stats [16384, 4] fp32 (a_0, a_1, rstd_1, rstd_x).
  check(mix_merge_norm_forward_traffic({N, d, 1}, bf16), X + S + X + 2 * W, X + 4 * S);
  // Backward: reads du, o, the partial sum, stats, w, gain, the partial sum's
  // gradient (+=), dw and dgain (+=); writes d_o, dlse, the partial sum's
  // gradient, dw, dgain.
  check(mix_merge_norm_backward_traffic({N, d, 1}, bf16),
        X + X + X + 4 * S + 2 * W + X + 2 * G, X + S + X + 2 * G);
  // The final Mix: one query over 9 sources, no lse.
  check(mix_forward_traffic({N, d, 9, 1, false}, bf16), 9 * X + 9 * S + W, X + 9 * S);
  check(mix_backward_traffic({N, d, 9, 1, false}, bf16),
        9 * X + 9 * S + W + X + 9 * S + 9 * X + G, 9 * X + G);
  // A source's rstd: one [16384, 768] read, one [16384] written.
  check(mix_source_rstd_traffic(N, d, bf16), X, S);
}

TEST_CASE("Mix traffic = hand counts for Full AttnRes at 124M (bf16)", "[mix_traffic]") {
  const int64_t N = 16384, d = 768;
  // Phase 1 of the last group: 4 queries over 21 sources.
  check(mix_forward_traffic({N, d, 21, 4, true}, bf16), 21 * X + 21 * S + 4 * W,
        4 * X + 4 * 21 * S + 4 * S);
  check(mix_backward_traffic({N, d, 21, 4, true}, bf16),
        21 * X + 21 * S + 4 * W + 4 * X + 4 * 21 * S + 4 * S + 21 * X + 4 * G, 21 * X + 4 * G);
  // The largest merge: m = 4 recent sources, stats [16384, 10].
  check(mix_merge_norm_forward_traffic({N, d, 4}, bf16), X + S + 4 * X + 2 * W, X + 10 * S);
  check(mix_merge_norm_backward_traffic({N, d, 4}, bf16),
        X + X + 4 * X + 10 * S + 2 * W + 4 * X + 2 * G, X + S + 4 * X + 2 * G);
  // In MB as bench prints them (1 MB = 1e6 B): phase 1 forward + backward of
  // the last group moves 2.33 GB.
  const double p1 = mix_forward_traffic({N, d, 21, 4, true}, bf16).total() +
                    mix_backward_traffic({N, d, 21, 4, true}, bf16).total();
  CHECK(p1 == Approx(2329.579520e6).epsilon(1e-12));
}
