#include "tools/bench_kernels.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "core/build_config.h"
#include "core/device.h"
#include "core/rng.h"
#include "core/scoped_env.h"
#include "kernels/adamw.h"
#include "kernels/attention.h"
#include "kernels/common.h"
#include "kernels/cross_entropy.h"
#include "kernels/embedding.h"
#include "kernels/matmul.h"
#include "kernels/mix.h"
#include "kernels/mix_traffic.h"
#include "kernels/reduce.h"
#include "kernels/rmsnorm.h"
#include "kernels/rope.h"
#include "kernels/swiglu.h"
#if ATTNRES_HAVE_CUDA
#include "kernels/cuda/attention_cudnn.h"
#endif

namespace attnres::tools {

namespace kern = attnres::kernels;

namespace {

// Random N(0, scale) device tensor of `dtype` (never zeros: zeros can run
// faster than real data and hide unwritten outputs). Drawn on all host
// threads (counter-based, so the same values): at the 1b3 shapes one thread
// took minutes of a GPU session (2026-11-26) drawing the inputs.
Tensor rand_dev(const Shape& shape, DType dtype, uint64_t seed, double scale = 1.0) {
  Tensor h = Tensor::empty(shape, DType::F32);
  float* p = h.data<float>();
  const int64_t n = h.numel();
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) p[i] = static_cast<float>(scale * random_normal(seed, 5, i));
  Tensor d = Tensor::empty(shape, dtype, Device::CUDA);
  if (dtype == DType::F32) d.copy_from(h);
  else d.copy_from(h.to(dtype));
  return d;
}

Tensor ids_dev(int64_t n, int64_t vocab, uint64_t seed) {
  Tensor t = Tensor::empty({n}, DType::I32);
  int32_t* p = t.data<int32_t>();
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) p[i] = static_cast<int32_t>(random_u64(seed, 9, i) % vocab);
  return t.to(Device::CUDA);
}

// Mean milliseconds per call over `reps` back-to-back calls after 2 warm-ups.
double time_ms(const std::function<void()>& fn, int reps) {
  for (int i = 0; i < 2; ++i) fn();
  cuda::synchronize();
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < reps; ++i) fn();
  cuda::synchronize();
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / reps;
}

}  // namespace

void bench_kernels(const model::ModelConfig& c, int64_t B, int64_t T, DType dt, int64_t n_blocks,
                   const std::string& only) {
  const int64_t N = B * T, d = c.d_model, H = c.n_heads, Hkv = c.n_kv_heads, hd = d / H, F = c.d_ff,
                V = c.vocab_size;
  const double e = static_cast<double>(dtype_size(dt));  // bytes per activation element
  const DType st = kern::stat_dtype(dt), gt = kern::grad_dtype(dt);
  const double gsz = static_cast<double>(dtype_size(gt));
  const kern::MixBytes mb = kern::MixBytes::of(dt);

  // ---- the two ceilings, measured here ----
  double bw, peak;
  {
    Tensor a = rand_dev({256 << 20}, DType::F32, 1), b = Tensor::empty({256 << 20}, DType::F32, Device::CUDA);
    const double ms = time_ms([&] { b.copy_from(a); }, 10);
    bw = 2.0 * a.nbytes() / (ms * 1e-3);  // bytes read + written
  }
  {
    const int64_t n = 8192;
    Tensor x = rand_dev({n, n}, dt, 2), w = rand_dev({n, n}, dt, 3), y = Tensor::empty({n, n}, dt, Device::CUDA);
    const double ms = time_ms([&] { kern::matmul_forward(y, x, w); }, 5);
    peak = 2.0 * n * n * n / (ms * 1e-3);
  }
  std::printf("measured ceilings: copy %.0f GB/s (read+write), %s GEMM 8192^3 %.0f TFLOP/s\n",
              bw * 1e-9, dtype_name(dt), peak * 1e-12);
  std::fflush(stdout);

  // Each row is printed (and flushed) as soon as it is measured, so a run cut
  // off by a time limit keeps the rows it finished.
  // MB: the bytes the op must move (1 MB = 1e6 B), its floor at copy
  // bandwidth; for the Mix rows every input once and every output once
  // (kernels/mix_traffic.h), so "of floor" is their achieved fraction of it.
  std::printf("\n%-26s %10s %10s %10s %10s %9s  %s\n", "op", "ms", "floor ms", "MB", "GB/s",
              "TFLOP/s", "of floor (bound)");
  // A row: times fn when its name contains `only` (all rows when empty).
  int64_t rows_run = 0;
  std::vector<std::string> skipped;
  auto add = [&](const std::string& op, const std::function<void()>& fn, int n_reps, double bytes,
                 double flops) {
    if (op.find(only) == std::string::npos) {
      skipped.push_back(op);
      return;
    }
    ++rows_run;
    const double ms = time_ms(fn, n_reps);
    const double t_bytes = bytes / bw * 1e3, t_flops = flops / peak * 1e3;
    const double floor_ms = std::max(t_bytes, t_flops);
    std::printf("%-26s %10.3f %10.3f %10.1f %10.0f %9.1f  %5.1f%% (%s)\n", op.c_str(), ms, floor_ms,
                bytes * 1e-6, bytes / (ms * 1e-3) * 1e-9, flops / (ms * 1e-3) * 1e-12,
                100.0 * floor_ms / ms, t_flops > t_bytes ? "compute" : "memory");
    std::fflush(stdout);
  };
  const int reps = 20;

  // ---- linear layers ----
  // (qkv_proj, gate_up: attention's q, k and v projections and the MLP's gate
  // and up projections, each as one GEMM, as the model runs them.)
  for (auto [name, in, out] : {std::tuple<const char*, int64_t, int64_t>{"qkv_proj", d, (H + 2 * Hkv) * hd},
                               {"gate_up_proj", d, 2 * F}, {"down_proj", F, d}}) {
    Tensor x = rand_dev({N, in}, dt, 4), w = rand_dev({out, in}, dt, 5, 0.02);
    Tensor y = Tensor::empty({N, out}, dt, Device::CUDA), dy = rand_dev({N, out}, dt, 6);
    Tensor dx = Tensor::zeros({N, in}, dt, Device::CUDA), dw = Tensor::zeros({out, in}, gt, Device::CUDA);
    const double fl = 2.0 * N * in * out;
    add(std::string("matmul fwd ") + name, [&] { kern::matmul_forward(y, x, w); }, reps,
        e * (N * in + out * in + N * out), fl);
    // dx written (Store::Set, as the model's first producer of a buffer): read
    // dy twice, x and w once, write dx; dw read and written.
    add(std::string("matmul bwd ") + name,
        [&] { kern::matmul_backward(&dx, &dw, dy, x, w, kern::Store::Set); }, reps,
        e * (2.0 * N * out + 2.0 * N * in + out * in) + 2 * gsz * out * in, 2 * fl);
  }

  // ---- attention ----
  {
    // q | k | v in one tensor, as the model's one GEMM writes them (kernels/attention.h).
    const int64_t W = (H + 2 * Hkv) * hd;
    Tensor qkv = rand_dev({N, W}, dt, 7), dqkv = Tensor::zeros({N, W}, dt, Device::CUDA);
    Tensor out = Tensor::empty({N, H * hd}, dt, Device::CUDA), lse = Tensor::empty({B, H, T}, st, Device::CUDA);
    Tensor dout = rand_dev({N, H * hd}, dt, 10);
    const kern::AttnShape s{B, T, H, Hkv, hd};
    const double fwd_flops = 2.0 * B * H * T * T * hd;  // causal: half of 4 B H T^2 hd
    const double io = e * (2.0 * N * H * hd + 2.0 * N * Hkv * hd);
    add("attention fwd", [&] { kern::attention_forward(out, lse, qkv, s); }, reps, io, fwd_flops);
    kern::attention_forward(out, lse, qkv, s);
    add("attention bwd",
        [&] { kern::attention_backward(dqkv, dout, qkv, out, lse, s, kern::Store::Set); }, reps,
        2 * io + e * 2.0 * N * H * hd, 2.5 * fwd_flops);
#if ATTNRES_HAVE_CUDA
    // The same op on cuDNN's fused attention engines, where they run this shape.
    namespace cudnn = kern::cuda::cudnn;
    if (const std::string why = cudnn::sdpa_unsupported(s, dt); !why.empty()) {
      std::printf("(attention fwd/bwd (cudnn) skipped: %s)\n", why.c_str());
    } else {
      add("attention fwd (cudnn)", [&] { cudnn::sdpa_forward(out, lse, qkv, s); }, reps, io,
          fwd_flops);
      cudnn::sdpa_forward(out, lse, qkv, s);
      add("attention bwd (cudnn)",
          [&] { cudnn::sdpa_backward(dqkv, dout, qkv, out, lse, s, kern::Store::Set); },
          reps, 2 * io + e * 2.0 * N * H * hd, 2.5 * fwd_flops);
    }
#endif
  }

  // ---- row-wise ops ----
  {
    Tensor x = rand_dev({N, d}, dt, 11), g = rand_dev({d}, dt, 12), y = Tensor::empty({N, d}, dt, Device::CUDA);
    Tensor r = Tensor::empty({N}, st, Device::CUDA), dy = rand_dev({N, d}, dt, 13);
    Tensor dx = Tensor::zeros({N, d}, dt, Device::CUDA), dg = Tensor::zeros({d}, gt, Device::CUDA);
    add("rmsnorm fwd", [&] { kern::rmsnorm_forward(y, r, x, &g, 1e-5f); }, reps, e * 2.0 * N * d, 0);
    add("rmsnorm bwd", [&] { kern::rmsnorm_backward(dx, &dg, dy, x, r, &g, kern::Store::Set); }, reps,
        e * 3.0 * N * d, 0);  // read dy, x; write dx
  }
  {
    // q's and k's heads of the joint q | k | v rows, in one pass as the model runs it.
    Tensor qkv = rand_dev({N, (H + 2 * Hkv) * hd}, dt, 14);
    add("rope fwd (q, k)", [&] { kern::rope_forward(qkv, B, T, H + Hkv, hd, 10000.f); }, reps,
        e * 2.0 * N * (H + Hkv) * hd, 0);
  }
  {
    Tensor gu = rand_dev({N, 2 * F}, dt, 15), h = Tensor::empty({N, F}, dt, Device::CUDA);
    Tensor dh = rand_dev({N, F}, dt, 17), dgu = Tensor::zeros({N, 2 * F}, dt, Device::CUDA);
    add("swiglu fwd", [&] { kern::swiglu_forward(h, gu); }, reps, e * 3.0 * N * F, 0);
    add("swiglu bwd", [&] { kern::swiglu_backward(dgu, dh, gu, kern::Store::Set); }, reps,
        e * 5.0 * N * F, 0);  // read dh, gate, up; write dgate, dup
  }
  // A Mix row: the default kernels (the rows kernels where they apply,
  // kernels/mix_rows.h), then in bf16 the same row "... warp" with
  // ATTNRES_MIX_KERNELS=warp (the kernels kept for comparison until the rows
  // kernels have run on a GPU; fp32 has only the warp kernels, so one row).
  auto add_mix = [&](const std::string& op, const std::function<void()>& fn, double bytes,
                     double flops) {
    for (const std::string kernel : {"rows", "warp"}) {
      if (kernel == "warp" && dt != DType::BF16) break;
      ScopedEnv env("ATTNRES_MIX_KERNELS", kernel.c_str());
      add(op + (kernel == "warp" ? " warp" : ""), fn, reps, bytes, flops);
    }
  };
  // Phase 1 of a Mix group: Q queries over k sources, forward and backward
  // rows; returns the queries' outputs and lse for the merge rows.
  struct Phase1 {
    std::vector<Tensor> outs;
    Tensor lse, dlse;
  };
  auto phase1_rows = [&](const std::string& tag, Span<const Tensor> done,
                         Span<const Tensor> done_rs, Span<Tensor> ddone, int64_t Q) {
    const int64_t kb = static_cast<int64_t>(done.size());
    std::vector<Tensor> ws, douts, dws;
    Phase1 r;
    for (int64_t q = 0; q < Q; ++q) {
      ws.push_back(rand_dev({d}, dt, 42 + q));
      r.outs.push_back(Tensor::empty({N, d}, dt, Device::CUDA));
      douts.push_back(rand_dev({N, d}, dt, 60 + q));
      dws.push_back(Tensor::zeros({d}, gt, Device::CUDA));
    }
    Tensor gprobs = Tensor::empty({Q, N, kb}, st, Device::CUDA);
    r.lse = Tensor::empty({Q, N}, st, Device::CUDA);
    r.dlse = rand_dev({Q, N}, st, 80);
    // Run once untimed: the merge rows read these outputs even when --only
    // skips the timed rows.
    kern::mix_forward(r.outs, gprobs, &r.lse, ws, done, done_rs);
    const kern::MixQueries shape{N, d, kb, Q, true};
    add_mix("mix phase-1 fwd" + tag,
            [&] { kern::mix_forward(r.outs, gprobs, &r.lse, ws, done, done_rs); },
            kern::mix_forward_traffic(shape, mb).total(), 4.0 * kb * Q * N * d);
    add_mix("mix phase-1 bwd" + tag,
            [&] { kern::mix_backward(ddone, dws, douts, &r.dlse, ws, done, done_rs, gprobs); },
            kern::mix_backward_traffic(shape, mb).total(), 10.0 * kb * Q * N * d);
    return r;
  };
  // `count` random source rows [N, d] with their rstds, and zeroed gradients.
  struct MixSources {
    std::vector<Tensor> src, rs, dsrc;
  };
  auto mix_sources = [&](int64_t count, uint64_t seed) {
    MixSources m;
    for (int64_t j = 0; j < count; ++j) {
      m.src.push_back(rand_dev({N, d}, dt, seed + j));
      m.rs.push_back(Tensor::empty({N}, st, Device::CUDA));
      kern::mix_source_rstd(m.rs.back(), m.src.back(), 1e-5f);
      m.dsrc.push_back(Tensor::zeros({N, d}, dt, Device::CUDA));
    }
    return m;
  };
  {
    const int64_t ks = n_blocks + 1;  // the last block's sublayers: e + (N-1) blocks + partial
    MixSources ms = mix_sources(ks, 20);
    std::vector<Tensor> &src = ms.src, &rs = ms.rs, &dsrc = ms.dsrc;
    Tensor w = rand_dev({d}, dt, 40), out = Tensor::empty({N, d}, dt, Device::CUDA);
    Tensor probs = Tensor::empty({N, ks}, st, Device::CUDA), dout = rand_dev({N, d}, dt, 41);
    Tensor dw = Tensor::zeros({d}, gt, Device::CUDA);
    const std::string tag = " (k=" + std::to_string(ks) + ")";
    kern::mix_forward(out, probs, w, src, rs);  // probs for the bwd row, whatever --only runs
    const kern::MixQueries final_mix{N, d, ks, 1, false};
    add_mix("mix fwd" + tag, [&] { kern::mix_forward(out, probs, w, src, rs); },
            kern::mix_forward_traffic(final_mix, mb).total(), 4.0 * ks * N * d);
    // As the head runs it: the first backward to reach the sources writes their
    // gradients (Store::Set), so its floor reads none of them.
    add_mix("mix bwd" + tag,
            [&] { kern::mix_backward(dsrc, dw, dout, w, src, rs, probs, kern::Store::Set); },
            kern::mix_backward_traffic(final_mix, mb, false).total(), 8.0 * ks * N * d);
    add("mix source rstd", [&] { kern::mix_source_rstd(rs[0], src[0], 1e-5f); }, reps,
        kern::mix_source_rstd_traffic(N, d, mb).total(), 0);

    // Block AttnRes's two phases for the last block: phase 1 runs the block's
    // Q = S queries over its kb = ks - 1 completed blocks in one pass, phase 2
    // merges each sublayer's output with the partial sum.
    model::ModelConfig block = c;
    block.mode = model::ResidualMode::Block;
    block.block_size = 0;
    block.n_blocks = std::max<int64_t>(1, n_blocks);
    const int64_t kb = ks - 1, Q = block.resolved_block_size();
    if (kb >= 1) {
      const Phase1 p1 = phase1_rows(" (k=" + std::to_string(kb) + ", Q=" + std::to_string(Q) + ")",
                                    Span<const Tensor>(src.data(), size_t(kb)),
                                    Span<const Tensor>(rs.data(), size_t(kb)),
                                    Span<Tensor>(dsrc.data(), size_t(kb)), Q);
      const std::vector<Tensor>& outs = p1.outs;
      const Tensor &lse = p1.lse, &dlse = p1.dlse;
      // Phase 2 fused with the sublayer's RMSNorm (its output is u).
      const int64_t mp = 1;  // one recent source: the partial sum
      Tensor u = Tensor::empty({N, d}, dt, Device::CUDA);
      Tensor mstats = Tensor::empty({N, 2 * mp + 2}, st, Device::CUDA);
      const Span<const Tensor> part(&src[kb], size_t(mp));
      const Span<Tensor> dpart(&dsrc[kb], size_t(mp));
      Tensor lse0 = lse.rows(0, 1).reshape({N}), dlse0 = dlse.rows(0, 1).reshape({N});
      Tensor d_o = Tensor::empty({N, d}, dt, Device::CUDA), gain = rand_dev({d}, dt, 81);
      Tensor dgain = Tensor::zeros({d}, gt, Device::CUDA);
      kern::mix_merge_norm_forward(u, mstats, w, outs[0], lse0, part, gain, 1e-5f);  // mstats, as above
      const kern::MixMerge merge{N, d, mp};
      add_mix("mix merge + rmsnorm fwd",
              [&] { kern::mix_merge_norm_forward(u, mstats, w, outs[0], lse0, part, gain, 1e-5f); },
              kern::mix_merge_norm_forward_traffic(merge, mb).total(), 9.0 * N * d);
      add_mix("mix merge + rmsnorm bwd",
              [&] {
                kern::mix_merge_norm_backward(d_o, dlse0, dpart, dw, dgain, dout, w, outs[0], part,
                                              gain, mstats);
              },
              kern::mix_merge_norm_backward_traffic(merge, mb).total(), 20.0 * N * d);
    }
    // Full AttnRes's phase 1 at its last Mix group: Q = the group's sublayers
    // over k = 1 + (sublayers before the group) sources, the most of any group.
    model::ModelConfig full = c;
    full.mode = model::ResidualMode::Full;
    {
      const int64_t G = full.mix_group_size(), subl = 2 * c.n_layers;
      const int64_t s0 = (subl - 1) / G * G, kf = 1 + s0, Qf = subl - s0;
      MixSources fs = mix_sources(kf, 100);
      phase1_rows(" (full, k=" + std::to_string(kf) + ", Q=" + std::to_string(Qf) + ")", fs.src,
                  fs.rs, fs.dsrc, Qf);
    }
    // Full AttnRes's merge at its largest: the last sublayer of a Mix group
    // of G = ceil(sqrt(2L)) merges G - 1 recent sources.
    const int64_t m = std::min<int64_t>(full.mix_group_size() - 1, ks);
    if (m >= 1) {
      const Span<const Tensor> recent(src.data(), size_t(m));
      const Span<Tensor> drecent(dsrc.data(), size_t(m));
      Tensor o = rand_dev({N, d}, dt, 90), lse = rand_dev({N}, st, 91), dl = Tensor::empty({N}, st, Device::CUDA);
      Tensor u = Tensor::empty({N, d}, dt, Device::CUDA), mstats = Tensor::empty({N, 2 * m + 2}, st, Device::CUDA);
      Tensor d_o = Tensor::empty({N, d}, dt, Device::CUDA), gain = rand_dev({d}, dt, 92);
      Tensor dgain = Tensor::zeros({d}, gt, Device::CUDA);
      const std::string mtag = " (full, m=" + std::to_string(m) + ")";
      kern::mix_merge_norm_forward(u, mstats, w, o, lse, recent, gain, 1e-5f);  // mstats, as above
      const kern::MixMerge merge{N, d, m};
      add_mix("mix merge + rmsnorm fwd" + mtag,
              [&] { kern::mix_merge_norm_forward(u, mstats, w, o, lse, recent, gain, 1e-5f); },
              kern::mix_merge_norm_forward_traffic(merge, mb).total(), (4.0 * m + 5.0) * N * d);
      add_mix("mix merge + rmsnorm bwd" + mtag,
              [&] {
                kern::mix_merge_norm_backward(d_o, dl, drecent, dw, dgain, dout, w, o, recent, gain,
                                              mstats);
              },
              kern::mix_merge_norm_backward_traffic(merge, mb).total(), (10.0 * m + 12.0) * N * d);
    }
  }
  {
    Tensor tok = ids_dev(N, V, 50), w = rand_dev({V, d}, dt, 51, 0.02), out = Tensor::empty({N, d}, dt, Device::CUDA);
    Tensor dout = rand_dev({N, d}, dt, 52), dw = Tensor::zeros({V, d}, gt, Device::CUDA);
    add("embedding fwd", [&] { kern::embedding_forward(out, w, tok); }, reps, e * 2.0 * N * d, 0);
    add("embedding bwd", [&] { kern::embedding_backward(dw, dout, tok); }, reps, (e + 2 * gsz) * N * d, 0);
  }
  {
    Tensor h = rand_dev({N, d}, dt, 60), w = rand_dev({V, d}, dt, 61, 0.02), tg = ids_dev(N, V, 62);
    Tensor dh = Tensor::zeros({N, d}, dt, Device::CUDA), dw = Tensor::zeros({V, d}, gt, Device::CUDA);
    // Both rows count the bytes of a head whose logits never leave the chip
    // (h, w read, dh written, dw read and written) and the three GEMMs' FLOPs,
    // so they share one floor: the logit traffic (14 N V bytes with fp32
    // logits, 10 N V with bf16; see cuda/cross_entropy.cu) is the gap to it.
    const double bytes = e * (2.0 * N * d + 2.0 * V * d) + 2 * gsz * V * d, flops = 6.0 * N * V * d;
    for (const DType logits : {DType::F32, DType::BF16}) {
      if (logits == DType::BF16 && dt != DType::BF16) continue;  // bf16 logits: bf16 runs only
      add(logits == DType::F32 ? "lm_head + CE fwd+bwd" : "lm_head + CE fwd+bwd (bf16 logits)",
          [&] { kern::lm_head_cross_entropy(h, w, tg, &dh, &dw, 1.0 / N, kern::Store::Set, logits); },
          5, bytes, flops);
    }
  }
  {
    const int64_t P = 124'000'000;  // a 124M-parameter model's update, fp32 master + bf16 copy
    Tensor p = rand_dev({P}, DType::F32, 70, 0.02), g = rand_dev({P}, DType::F32, 71, 1e-3);
    Tensor m = Tensor::zeros({P}, DType::F32, Device::CUDA), v = Tensor::zeros({P}, DType::F32, Device::CUDA);
    Tensor lowp = Tensor::empty({P}, DType::BF16, Device::CUDA);
    const kern::AdamWStep s{1e-4, 0.9, 0.95, 1e-8, 0.1, 1};
    const bool bf = dt == DType::BF16;
    add("adamw 124M params", [&] { kern::adamw_update(p, g, m, v, s, true, bf ? &lowp : nullptr); }, 5,
        P * (28.0 + (bf ? 2 : 0)), 0);
    add("grad norm 124M", [&] { (void)kern::sum_squares(g); }, 5, P * 4.0, 0);
  }
  if (rows_run == 0) {
    std::string names;
    for (const std::string& op : skipped) names += "\n  " + op;
    fail("bench --kernels --only '", only, "': no row's name contains it; the rows are:", names);
  }
}

}  // namespace attnres::tools
