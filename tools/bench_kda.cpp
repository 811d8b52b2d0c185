// attnres bench --kda: the KDA core on the CPU (kernels/kda.h), the chunkwise
// forward and backward against the token-by-token recurrence, each against
// its two floors: FLOPs / this machine's measured GEMM rate and bytes /
// its measured copy bandwidth. A benchmark that prints figures, not a test.
#include "tools/bench_kda.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <vector>

#include "core/rng.h"
#include "kernels/cpu/blas.h"
#include "kernels/kda.h"

namespace attnres::tools {

namespace {

double seconds_of(const std::function<void()>& f, int reps) {
  f();  // warm-up
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];  // the median
}

Tensor uniform(const Shape& shape, uint64_t seed, float lo, float hi) {
  Tensor t = Tensor::empty(shape, DType::F32);
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i)
    p[i] = lo + (hi - lo) * static_cast<float>(random_uniform(seed, 0, static_cast<uint64_t>(i)));
  return t;
}

}  // namespace

void bench_kda(int64_t B, int64_t T, int64_t H, int64_t K, int steps) {
  const kernels::KdaShape s{B, T, H, K, K, 64};
  const int64_t N = B * T, V = K;
  // Inputs as the layer makes them: unit q and k rows per head, decays of
  // exp(-softplus), write strengths in (0, 1).
  Tensor q = uniform({N, H * K}, 1, -1, 1), k = uniform({N, H * K}, 2, -1, 1);
  for (Tensor* t : {&q, &k}) {
    float* p = t->data<float>();
    for (int64_t r = 0; r < N * H; ++r) {
      double ss = 0;
      for (int64_t c = 0; c < K; ++c) ss += double(p[r * K + c]) * p[r * K + c];
      for (int64_t c = 0; c < K; ++c) p[r * K + c] = static_cast<float>(p[r * K + c] / std::sqrt(ss + 1e-6));
    }
  }
  const Tensor v = uniform({N, H * V}, 3, -1, 1), g = uniform({N, H * K}, 4, -1.5f, -0.01f),
               beta = uniform({N, H}, 5, 0.05f, 0.95f), dout = uniform({N, H * V}, 6, -1, 1);
  Tensor o = Tensor::empty({N, H * V}), dq = Tensor::empty(q.shape()), dk = Tensor::empty(q.shape()),
         dv = Tensor::empty(v.shape()), dg = Tensor::empty(q.shape()), db = Tensor::empty(beta.shape());
  const double scale = 1 / std::sqrt(double(K));

  // The ceilings: a 1024^3 GEMM on the OpenMP team, and a 256 MiB copy.
  const int64_t G = 1024;
  std::vector<float> a(size_t(G * G), 0.5f), bm(size_t(G * G), 0.25f), cm(size_t(G * G));
  const double gemm_s = seconds_of([&] {
    kernels::cpu::gemm<float>(false, false, G, G, G, 1.0f, a.data(), G, bm.data(), G, 0.0f, cm.data(), G);
  }, 3);
  const double peak = 2.0 * G * G * G / gemm_s;
  std::vector<char> src(size_t(256) << 20, 1), dst(src.size());
  const double copy_s = seconds_of([&] { std::memcpy(dst.data(), src.data(), src.size()); }, 3);
  const double bw = 2.0 * static_cast<double>(src.size()) / copy_s;

  // FLOPs (multiply-adds count 2) per (sequence, head):
  //  chunkwise forward, per chunk of n rows: Kb S_0, Qb S_0 and the state's
  //  Ke^T U (2 n K V each), P U (2 n^2 V), A and P (about 2 n^2 K each, half of
  //  them as GEMMs across sub-chunks), the substitution (n^2 V);
  //  backward: the forward's again (the states and U recomputed) and about 3x
  //  it for the adjoints; the recurrence: 7 K V a token (decay, S^T k, the
  //  update, S^T q); its backward about 27 K V a token (the adjoint's 17,
  //  and the state steps, 5 K V each, run twice: the stretches' start
  //  states, then each stretch again).
  double fwd = 0;
  for (int64_t t0 = 0; t0 < T; t0 += 64) {
    const double n = double(std::min<int64_t>(64, T - t0));
    fwd += 6 * n * K * V + 2 * n * n * V + 2 * n * n * K + n * n * V;
  }
  fwd *= double(B * H);
  const double bwd = 4 * fwd, rec = 7.0 * double(N * H) * K * V, rec_bwd = 27.0 * double(N * H) * K * V;
  // Bytes: q, k, g, v, beta in and o out (forward, recurrence); the backward
  // reads those and dout and writes the five gradients.
  const double io = 4.0 * double(N * H) * (3 * K + 2 * V + 1);
  const double io_bwd = 4.0 * double(N * H) * (6 * K + 3 * V + 2);

  const double t_fwd = seconds_of([&] { kernels::kda_forward(o, q, k, v, g, beta, s, scale); }, steps);
  const double t_bwd = seconds_of([&] {
    kernels::kda_backward(dq, dk, dv, dg, db, dout, q, k, v, g, beta, s, scale, kernels::Store::Set);
  }, steps);
  const Tensor o_chunk = o.clone();
  const double t_rec = seconds_of([&] { kernels::kda_recurrent_forward(o, q, k, v, g, beta, s, scale); }, steps);
  const double t_rec_bwd = seconds_of([&] {
    kernels::kda_recurrent_backward(dq, dk, dv, dg, db, dout, q, k, v, g, beta, s, scale, kernels::Store::Set);
  }, steps);
  // The two forms' outputs (the same function; fp32 rounding apart).
  double diff = 0, big = 0;
  for (int64_t i = 0; i < o.numel(); ++i) {
    const double a = o_chunk.data<float>()[i], b = o.data<float>()[i];
    diff = std::isnan(a - b) ? a - b : std::max(diff, std::fabs(a - b));
    big = std::max(big, std::fabs(b));
  }

  std::printf("KDA core on the cpu: B %lld, T %lld, H %lld, K = V = %lld, chunks of 64 (fp32; %s)\n",
              (long long)B, (long long)T, (long long)H, (long long)K, kernels::cpu::blas_description().c_str());
  std::printf("measured ceilings: GEMM %.1f GFLOP/s (1024^3 sgemm), copy %.1f GB/s (256 MiB)\n",
              peak / 1e9, bw / 1e9);
  std::printf("%-26s %9s %9s %9s %12s %12s\n", "op", "ms", "GFLOP/s", "tok/s", "FLOP floor", "byte floor");
  auto row = [&](const char* name, double t, double flops, double bytes) {
    std::printf("%-26s %9.3f %9.2f %9.0f %8.3f ms %8.3f ms\n", name, t * 1e3, flops / t / 1e9,
                double(N) / t, flops / peak * 1e3, bytes / bw * 1e3);
  };
  row("chunkwise forward", t_fwd, fwd, io);
  row("chunkwise backward", t_bwd, bwd, io_bwd);
  row("recurrent forward", t_rec, rec, io);
  row("recurrent backward", t_rec_bwd, rec_bwd, io_bwd);
  std::printf("forward + backward: chunkwise %.3f ms, token by token %.3f ms: the chunkwise pair at "
              "%.2fx the recurrence's speed (%.2fx at the GEMM ceiling: its FLOP floor)\n",
              (t_fwd + t_bwd) * 1e3, (t_rec + t_rec_bwd) * 1e3, (t_rec + t_rec_bwd) / (t_fwd + t_bwd),
              (t_rec + t_rec_bwd) / ((fwd + bwd) / peak));
  std::printf("chunkwise forward against the recurrent forward: %.2fx its speed\n", t_rec / t_fwd);
  std::printf("chunkwise output against the recurrence's: max |difference| %.3g (max |o| %.3g)\n",
              diff, big);
}

}  // namespace attnres::tools
