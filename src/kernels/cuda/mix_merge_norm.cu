// CUDA AttnRes depth Mix, phase 2 (see kernels/mix.h; mix_common.cuh has
// the row groups and the overview, mix.cu phase 1 and the dw kernels): the
// merge with the m recent sources (Block: the partial sum; Full: the group's
// earlier outputs) fused with the RMSNorm that reads its result, one row
// group per row. The forward reads o and the recent rows and writes u = the
// normalised x (x stays in registers); the backward reads du, o and the
// recent rows, recomputes x, and writes d_o and the recent rows' gradients
// (read-add-write). With m = 1 (Block AttnRes): 3 and 6 passes against 5 and
// 9 for a separate merge and RMSNorm. dw goes through the dw kernels (the
// recent rows as sources), dgain through block partials and the same
// fixed-order reduction.
#include "kernels/cuda/mix.h"

#include "kernels/cuda/mix_common.cuh"
#include "kernels/math.h"

namespace attnres::kernels::cuda::mix {

namespace {

// The online softmax of math::OnlineSoftmax started from phase 1's state (max
// lse, sum 1, accumulator o), one recent source e_j at a time (its rstd_j and
// w . e_j from one paired reduction), as the CPU; then x = acc / l and
// u = RMSNorm(x; gain). stats[row] = {a_0..a_m, rstd_1..rstd_m, rstd_x}.
// x lives in registers only; the logits wait in a small per-thread array
// (m <= kMaxSources; local memory, a few words per row).
template <typename T, int VPT, bool ALIGNED>
__global__ void __launch_bounds__(kMaxThreads)
    merge_norm_forward_kernel(T* u, float* stats, const T* w, const T* o, const float* lse,
                              Sources<T> rec, int m, const T* gain, int64_t N, int64_t d,
                              float eps, bool block_mode) {
  __shared__ float2 scratch[32];
  const Group g = Group::make(block_mode);
  const int64_t row = int64_t(blockIdx.x) * g.per_block + g.index;
  if (row >= N) return;  // warp mode only: no barrier skipped
  const int64_t off = row * d;
  const long long dl = static_cast<long long>(d);
  float wf[VPT][8], acc[VPT][8];
#pragma unroll
  for (int i = 0; i < VPT; ++i) {
    unpack(load_pack<T, ALIGNED>(w, g.slot_base(i), d), wf[i]);
    unpack(load_pack<T, ALIGNED>(o + off, g.slot_base(i), d), acc[i]);
  }
  const float lse_row = lse[row];
  math::OnlineSoftmax<float> sm;
  float weight;
  sm.push(lse_row, weight);  // weight 1: the accumulator starts as o
  float z[kMaxSources], rs[kMaxSources];
  for (int j = 0; j < m; ++j) {
    float e[VPT][8];
    float2 t = make_float2(0.0f, 0.0f);  // {e . e, w . e}
#pragma unroll
    for (int i = 0; i < VPT; ++i) {
      unpack(load_pack<T, ALIGNED>(rec.v[j] + off, g.slot_base(i), d), e[i]);
#pragma unroll
      for (int c = 0; c < 8; ++c) {
        t.x = fmaf(e[i][c], e[i][c], t.x);
        t.y = fmaf(wf[i][c], e[i][c], t.y);
      }
    }
    t = g.sum2(t, scratch);
    rs[j] = math::rstd_from_sum_sq(t.x, dl, eps);
    z[j] = t.y * rs[j];
    const float scale = sm.push(z[j], weight);
#pragma unroll
    for (int i = 0; i < VPT; ++i)
#pragma unroll
      for (int c = 0; c < 8; ++c) acc[i][c] = fmaf(weight, e[i][c], acc[i][c] * scale);
  }
  const float inv = 1.0f / sm.l;
  float2 ss = make_float2(0.0f, 0.0f);  // {x . x, unused}
#pragma unroll
  for (int i = 0; i < VPT; ++i)
#pragma unroll
    for (int c = 0; c < 8; ++c) {
      acc[i][c] *= inv;  // x
      ss.x = fmaf(acc[i][c], acc[i][c], ss.x);
    }
  ss = g.sum2(ss, scratch);
  const float rx = math::rstd_from_sum_sq(ss.x, dl, eps);
#pragma unroll
  for (int i = 0; i < VPT; ++i) {
    float gf[8], uv[8];
    unpack(load_pack<T, ALIGNED>(gain, g.slot_base(i), d), gf);
#pragma unroll
    for (int c = 0; c < 8; ++c) uv[c] = acc[i][c] * rx * gf[c];
    store8<T, ALIGNED>(u + off, g.slot_base(i), d, uv);
  }
  if (g.tid == 0) {
    float* st = stats + row * (2 * m + 2);
    st[0] = expf(lse_row - sm.m) * inv;
    for (int j = 0; j < m; ++j) {
      st[1 + j] = expf(z[j] - sm.m) * inv;
      st[m + 1 + j] = rs[j];
    }
    st[2 * m + 1] = rx;
  }
}

// Per row (x = a_0 o + sum_j a_j e_j recomputed in fp32, r = rstd_x), as the CPU:
//   dx = r g du - x r^3 (du . g x) / d;  dgain += du x r
//   s_0 = dx . o, s_j = dx . e_j, s = sum_i a_i s_i
//   d_o = a_0 dx;  dlse = a_0 (s_0 - s);  dz_j = a_j (s_j - s)
//   de_j += a_j dx + dz_j r_j w - dz_j r_j^3 (w . e_j) e_j / d;  coef[row, j] = dz_j r_j
// (dw += coef e_j by mix_dw_kernel, a fourth pass over the recent rows). Three
// passes over the recent rows here (x; the dots; the updates), the second and
// third mostly from L1/L2. Each
// thread does the read-add-write of de_j for its own elements source after
// source, so drecent may alias. dgain: each group accumulates its rows in
// registers over a fixed grid-stride row assignment; the block's groups are
// summed in order into dgain_partial[blockIdx] (through shared memory in warp
// mode), and dw_reduce_kernel sums the block partials in a fixed order.
template <typename T, int VPT, bool ALIGNED>
__global__ void __launch_bounds__(kMaxThreads)
    merge_norm_backward_kernel(T* d_o, float* dlse, DSources<T> drec, float* coef,
                               float* dgain_partial, const T* du, const T* w, const T* o,
                               Sources<T> rec, int m, const T* gain, const float* stats,
                               int64_t N, int64_t d, bool block_mode, bool set) {
  extern __shared__ __align__(16) unsigned char smem[];
  __shared__ float2 scratch[32];
  const Group g = Group::make(block_mode);
  const float fd = static_cast<float>(d);
  float dgacc[VPT][8];
#pragma unroll
  for (int i = 0; i < VPT; ++i)
#pragma unroll
    for (int c = 0; c < 8; ++c) dgacc[i][c] = 0.0f;

  const int64_t groups = int64_t(gridDim.x) * g.per_block;
  for (int64_t row = int64_t(blockIdx.x) * g.per_block + g.index; row < N; row += groups) {
    const int64_t off = row * d;
    const float* st = stats + row * (2 * m + 2);
    const float a0 = st[0], r = st[2 * m + 1];
    float x[VPT][8], gx[VPT][8];  // x, and g du (then dx)
#pragma unroll
    for (int i = 0; i < VPT; ++i) {
      float ov[8];
      unpack(load_pack<T, ALIGNED>(o + off, g.slot_base(i), d), ov);
#pragma unroll
      for (int c = 0; c < 8; ++c) x[i][c] = a0 * ov[c];
    }
    for (int j = 0; j < m; ++j) {
      const float aj = st[1 + j];
#pragma unroll
      for (int i = 0; i < VPT; ++i) {
        float ev[8];
        unpack(load_pack<T, ALIGNED>(rec.v[j] + off, g.slot_base(i), d), ev);
#pragma unroll
        for (int c = 0; c < 8; ++c) x[i][c] = fmaf(aj, ev[c], x[i][c]);
      }
    }
    float2 t = make_float2(0.0f, 0.0f);  // {du . g x, unused}
#pragma unroll
    for (int i = 0; i < VPT; ++i) {
      const int64_t sb = g.slot_base(i);
      float dv[8], gf[8];
      unpack(load_pack<T, ALIGNED>(du + off, sb, d), dv);
      unpack(load_pack<T, ALIGNED>(gain, sb, d), gf);
#pragma unroll
      for (int c = 0; c < 8; ++c) {
        gx[i][c] = gf[c] * dv[c];
        t.x = fmaf(gx[i][c], x[i][c], t.x);
        dgacc[i][c] = fmaf(dv[c] * x[i][c], r, dgacc[i][c]);
      }
    }
    t = g.sum2(t, scratch);
    const float c3 = r * r * r * t.x / fd;
    float2 s0 = make_float2(0.0f, 0.0f);  // {dx . o, unused}
#pragma unroll
    for (int i = 0; i < VPT; ++i) {
      float ov[8];
      unpack(load_pack<T, ALIGNED>(o + off, g.slot_base(i), d), ov);  // L1 hits
#pragma unroll
      for (int c = 0; c < 8; ++c) {
        gx[i][c] = r * gx[i][c] - c3 * x[i][c];  // dx
        s0.x = fmaf(gx[i][c], ov[c], s0.x);
      }
    }
    s0 = g.sum2(s0, scratch);
    float s = a0 * s0.x;
    float sj[kMaxSources], we[kMaxSources];  // dx . e_j, w . e_j
    for (int j = 0; j < m; ++j) {
      float2 q = make_float2(0.0f, 0.0f);
#pragma unroll
      for (int i = 0; i < VPT; ++i) {
        const int64_t sb = g.slot_base(i);
        float ev[8], wf[8];
        unpack(load_pack<T, ALIGNED>(rec.v[j] + off, sb, d), ev);
        unpack(load_pack<T, ALIGNED>(w, sb, d), wf);
#pragma unroll
        for (int c = 0; c < 8; ++c) {
          q.x = fmaf(gx[i][c], ev[c], q.x);
          q.y = fmaf(wf[c], ev[c], q.y);
        }
      }
      q = g.sum2(q, scratch);
      sj[j] = q.x;
      we[j] = q.y;
      s = fmaf(st[1 + j], q.x, s);
    }
    if (g.tid == 0) dlse[row] = a0 * (s0.x - s);
#pragma unroll
    for (int i = 0; i < VPT; ++i) {
      float od[8];
#pragma unroll
      for (int c = 0; c < 8; ++c) od[c] = a0 * gx[i][c];
      store8<T, ALIGNED>(d_o + off, g.slot_base(i), d, od);
    }
    for (int j = 0; j < m; ++j) {
      const float aj = st[1 + j], rj = st[m + 1 + j];
      const float dz = aj * (sj[j] - s);  // dlogit_j
      const auto [cw, ce] = math::mix_backward_coefs(dz, rj, we[j], fd);
      if (g.tid == 0) coef[row * m + j] = cw;
      T* der = drec.dv[j] + off;
#pragma unroll
      for (int i = 0; i < VPT; ++i) {
        const int64_t sb = g.slot_base(i);
        float wf[8], ev[8], de[8];
        unpack(load_pack<T, ALIGNED>(w, sb, d), wf);
        unpack(load_pack<T, ALIGNED>(rec.v[j] + off, sb, d), ev);
        if (set) {  // Store::Set: the sum starts from 0, the old contents unread
#pragma unroll
          for (int c = 0; c < 8; ++c) de[c] = 0.0f;
        } else {
          unpack(load_pack<T, ALIGNED>(der, sb, d), de);
        }
#pragma unroll
        for (int c = 0; c < 8; ++c) de[c] += fmaf(ce, ev[c], fmaf(cw, wf[c], aj * gx[i][c]));
        store8<T, ALIGNED>(der, sb, d, de);
      }
    }
  }

  // dgain partial of this block: its groups' accumulators summed in group order.
  sum_groups_in_order<VPT>(dgain_partial + int64_t(blockIdx.x) * d, reinterpret_cast<float*>(smem),
                           dgacc, g, d);
}

// ---- the rows kernels (kernels/mix_rows.h) ------------------------------------
// A block per row at a time (rows strided over a grid of resident blocks),
// thread t the 4 elements [4 t, 4 t + 4); M = m recent sources, a template
// parameter so the rows of o and the recent sources stay in registers (8
// bytes each) for the whole row. Same formulas as the warp kernels above.
// Why: the warp backward holds 175 registers (12.5% occupancy) and reads the
// recent rows three times and again in mix_dw_kernel; here each input row is
// read once, dw and dgain are summed in registers over the block's rows and
// written as per-block partials, and the kernels stay within 64 registers.

// Forward: the M paired dots {e_j . e_j, w . e_j} in one block reduction
// (they do not depend on the softmax), then the online softmax from phase
// 1's state (lse, o) over the recent sources in order, x = acc / l, and
// u = RMSNorm(x; gain) with x . x in a second reduction: 4 barriers per row.
template <int M>
__global__ void __launch_bounds__(rows::kMaxThreads, 1)
    merge_norm_forward_rows_kernel(bf16* u, float* stats, const bf16* w, const bf16* o,
                                   const float* lse, Sources<bf16> rec, const bf16* gain,
                                   int64_t N, int64_t d, float eps) {
  __shared__ float red[32 * 2 * M];
  const rows::Slot sl(d);
  const long long dl = static_cast<long long>(d);
  float wf[rows::kEpt], gf[rows::kEpt];
  rows::unpack(sl.load(w), wf);
  rows::unpack(sl.load(gain), gf);
  for (int64_t row = blockIdx.x; row < N; row += gridDim.x) {
    const int64_t off = row * d;
    const uint2 ob = sl.load(o + off);
    uint2 eb[M];
#pragma unroll
    for (int j = 0; j < M; ++j) eb[j] = sl.load(rec.v[j] + off);
    float p[2 * M];  // {e_j . e_j, w . e_j}
#pragma unroll
    for (int j = 0; j < M; ++j) {
      float e[rows::kEpt];
      rows::unpack(eb[j], e);
      p[2 * j] = rows::dot(e, e);
      p[2 * j + 1] = rows::dot(wf, e);
    }
    rows::block_sums<2 * M>(p, red);
    float acc[rows::kEpt];
    rows::unpack(ob, acc);
    const float lse_row = lse[row];
    math::OnlineSoftmax<float> sm;
    float weight;
    sm.push(lse_row, weight);  // weight 1: the accumulator starts as o
    float z[M], rs[M];
#pragma unroll
    for (int j = 0; j < M; ++j) {
      rs[j] = math::rstd_from_sum_sq(p[2 * j], dl, eps);
      z[j] = p[2 * j + 1] * rs[j];
      const float scale = sm.push(z[j], weight);
      float e[rows::kEpt];
      rows::unpack(eb[j], e);
#pragma unroll
      for (int c = 0; c < rows::kEpt; ++c) acc[c] = fmaf(weight, e[c], acc[c] * scale);
    }
    const float inv = 1.0f / sm.l;
#pragma unroll
    for (int c = 0; c < rows::kEpt; ++c) acc[c] *= inv;  // x
    float ss[1] = {rows::dot(acc, acc)};
    rows::block_sums<1>(ss, red);
    const float rx = math::rstd_from_sum_sq(ss[0], dl, eps);
    float uv[rows::kEpt];
#pragma unroll
    for (int c = 0; c < rows::kEpt; ++c) uv[c] = acc[c] * rx * gf[c];
    sl.store(u + off, uv);
    if (threadIdx.x == 0) {
      float* st = stats + row * (2 * M + 2);
      st[0] = expf(lse_row - sm.m) * inv;
#pragma unroll
      for (int j = 0; j < M; ++j) {
        st[1 + j] = expf(z[j] - sm.m) * inv;
        st[M + 1 + j] = rs[j];
      }
      st[2 * M + 1] = rx;
    }
  }
}

// Backward (the warp kernel's formulas): x recomputed from o and the recent
// rows held in registers; t = du . g x in one block reduction; then dx and
// the 1 + 2M dots {dx . o, dx . e_j, w . e_j} in a second; d_o, dlse and
// each de_j's read-add-write (source by source, so drecent may alias: the
// rows of de_j are loaded ahead only when every drecent is its own tensor,
// `distinct`, and M <= 2). dgain += du x r and dw += coef_j e_j in registers over the
// block's rows; at the end partial[0][block] = dgain's, partial[1][block] =
// dw's, summed by launch_dw_reduce in block order.
template <int M>
__global__ void __launch_bounds__(rows::kMaxThreads, 1)
    merge_norm_backward_rows_kernel(bf16* d_o, float* dlse, DSources<bf16> drec, float* partial,
                                    const bf16* du, const bf16* w, const bf16* o,
                                    Sources<bf16> rec, const bf16* gain, const float* stats,
                                    int64_t N, int64_t d, bool distinct, bool set) {
  __shared__ float red[32 * (1 + 2 * M)];
  const rows::Slot sl(d);
  const float fd = static_cast<float>(d);
  float wf[rows::kEpt], gf[rows::kEpt], dg[rows::kEpt], dw[rows::kEpt];
  rows::unpack(sl.load(w), wf);
  rows::unpack(sl.load(gain), gf);
#pragma unroll
  for (int c = 0; c < rows::kEpt; ++c) dg[c] = 0.0f, dw[c] = 0.0f;

  for (int64_t row = blockIdx.x; row < N; row += gridDim.x) {
    const int64_t off = row * d;
    const uint2 ob = sl.load(o + off), dub = sl.load(du + off);
    // The rows of de_j ahead too where registers allow (ptxas: spills from
    // M = 3 with them, from M = 5 without).
    constexpr bool kAhead = M <= 2;
    uint2 eb[M], deb[kAhead ? M : 1];
#pragma unroll
    for (int j = 0; j < M; ++j) {
      eb[j] = sl.load(rec.v[j] + off);
      if constexpr (kAhead) deb[j] = distinct && !set ? sl.load(drec.dv[j] + off) : make_uint2(0, 0);
    }
    const float* st = stats + row * (2 * M + 2);
    const float a0 = st[0], r = st[2 * M + 1];
    float ov[rows::kEpt], x[rows::kEpt], gx[rows::kEpt];
    rows::unpack(ob, ov);
#pragma unroll
    for (int c = 0; c < rows::kEpt; ++c) x[c] = a0 * ov[c];
#pragma unroll
    for (int j = 0; j < M; ++j) {
      const float aj = st[1 + j];
      float e[rows::kEpt];
      rows::unpack(eb[j], e);
#pragma unroll
      for (int c = 0; c < rows::kEpt; ++c) x[c] = fmaf(aj, e[c], x[c]);
    }
    float dy[rows::kEpt];
    rows::unpack(dub, dy);
#pragma unroll
    for (int c = 0; c < rows::kEpt; ++c) {
      gx[c] = gf[c] * dy[c];
      dg[c] = fmaf(dy[c] * x[c], r, dg[c]);
    }
    float t[1] = {rows::dot(gx, x)};
    rows::block_sums<1>(t, red);
    const float c3 = r * r * r * t[0] / fd;
#pragma unroll
    for (int c = 0; c < rows::kEpt; ++c) gx[c] = r * gx[c] - c3 * x[c];  // dx
    float p[1 + 2 * M];  // {dx . o, dx . e_j, w . e_j}
    p[0] = rows::dot(gx, ov);
#pragma unroll
    for (int j = 0; j < M; ++j) {
      float e[rows::kEpt];
      rows::unpack(eb[j], e);
      p[1 + j] = rows::dot(gx, e);
      p[1 + M + j] = rows::dot(wf, e);
    }
    rows::block_sums<1 + 2 * M>(p, red);
    float s = a0 * p[0];
#pragma unroll
    for (int j = 0; j < M; ++j) s = fmaf(st[1 + j], p[1 + j], s);
    if (threadIdx.x == 0) dlse[row] = a0 * (p[0] - s);
    float od[rows::kEpt];
#pragma unroll
    for (int c = 0; c < rows::kEpt; ++c) od[c] = a0 * gx[c];
    sl.store(d_o + off, od);
#pragma unroll
    for (int j = 0; j < M; ++j) {
      const float aj = st[1 + j], rj = st[M + 1 + j];
      const float dz = aj * (p[1 + j] - s);  // dlogit_j
      const auto [cw, ce] = math::mix_backward_coefs(dz, rj, p[1 + M + j], fd);
      float e[rows::kEpt], de[rows::kEpt];
      rows::unpack(eb[j], e);
      // (Loaded after the last store: drecent may alias. Store::Set: 0, unread.)
      if (set) rows::unpack(make_uint2(0, 0), de);
      else if constexpr (kAhead) rows::unpack(distinct ? deb[j] : sl.load(drec.dv[j] + off), de);
      else rows::unpack(sl.load(drec.dv[j] + off), de);
#pragma unroll
      for (int c = 0; c < rows::kEpt; ++c) {
        de[c] += fmaf(ce, e[c], fmaf(cw, wf[c], aj * gx[c]));
        dw[c] = fmaf(cw, e[c], dw[c]);
      }
      sl.store(drec.dv[j] + off, de);
    }
  }
  sl.store_f32(partial + int64_t(blockIdx.x) * d, dg);
  sl.store_f32(partial + (int64_t(gridDim.x) + blockIdx.x) * d, dw);
}

}  // namespace

}  // namespace attnres::kernels::cuda::mix

namespace attnres::kernels::cuda {

using namespace mix;

void mix_merge_norm_forward(Tensor& u, Tensor& stats, const Tensor& w, const Tensor& o,
                            const Tensor& lse, Span<const Tensor> recent, const Tensor& gain,
                            float eps) {
  const char* op = "mix_merge_norm_forward";
  check_capacity(op, recent.size());
  const int64_t N = o.dim(0), d = w.dim(0);
  const int m = static_cast<int>(recent.size());
  if (N == 0) return;
  dispatch_float(w, op, [&](auto tag) {
    using T = decltype(tag);
    bool aligned = d % 8 == 0 && aligned16(u.raw()) && aligned16(w.raw()) && aligned16(o.raw()) &&
                   aligned16(gain.raw());
    const Sources<T> rec = source_ptrs<T>(recent, {}, aligned);
    // The rows kernel where it applies (kernels/mix_rows.h).
    const mix_rows::Plan plan = mix_rows::plan_merge(
        std::is_same_v<T, bf16>, rows_aligned(d, {one(u), one(w), one(o), recent, one(gain)}), d, m);
    if constexpr (std::is_same_v<T, bf16>) {
      if (plan.rows) {
        with_int<1, mix_rows::kMaxRecent>("m", m, [&](auto mn) {
          auto kernel = merge_norm_forward_rows_kernel<decltype(mn)::value>;
          const int64_t grid = resident_grid(op, kernel, plan.threads, 0, N, 1);
          kernel<<<static_cast<unsigned>(grid), plan.threads, 0, stream()>>>(
              dptr<bf16>(u), dptr<float>(stats), dptr<bf16>(w), dptr<bf16>(o), dptr<float>(lse),
              rec, dptr<bf16>(gain), N, d, eps);
          ATTNRES_CUDA_CHECK_LAUNCH();
        });
        return;
      }
    }
    const RowLayout lay = row_layout(op, d);
    const RowGrid grid = row_grid(lay, N);
    with_variant(lay.vpt, aligned, [&](auto vpt, auto al) {
      constexpr int VPT = decltype(vpt)::value;
      constexpr bool AL = decltype(al)::value;
      merge_norm_forward_kernel<T, VPT, AL><<<grid.blocks, grid.threads, 0, stream()>>>(
          dptr<T>(u), dptr<float>(stats), dptr<T>(w), dptr<T>(o), dptr<float>(lse), rec, m,
          dptr<T>(gain), N, d, eps, lay.block_mode());
      ATTNRES_CUDA_CHECK_LAUNCH();
    });
  });
}

void mix_merge_norm_backward(Tensor& d_o, Tensor& dlse, Span<Tensor> drecent, Tensor& dw,
                             Tensor& dgain, const Tensor& du, const Tensor& w, const Tensor& o,
                             Span<const Tensor> recent, const Tensor& gain, const Tensor& stats,
                             Store drecent_store) {
  const char* op = "mix_merge_norm_backward";
  const bool set = drecent_store == Store::Set;
  check_capacity(op, recent.size());
  const int64_t N = o.dim(0), d = w.dim(0);
  const int m = static_cast<int>(recent.size());
  if (N == 0 || d == 0) return;
  dispatch_float(w, op, [&](auto tag) {
    using T = decltype(tag);
    bool rec_aligned = d % 8 == 0;
    const Sources<T> rec = source_ptrs<T>(recent, {}, rec_aligned);
    DSources<T> drec{};
    bool aligned = rec_aligned && aligned16(d_o.raw()) && aligned16(du.raw()) &&
                   aligned16(w.raw()) && aligned16(o.raw()) && aligned16(gain.raw());
    for (int j = 0; j < m; ++j) {
      drec.dv[j] = dptr<T>(drecent[j]);
      aligned = aligned && aligned16(drec.dv[j]);
    }
    // The rows kernel where it applies (kernels/mix_rows.h): dgain and dw
    // from its per-block partials, no pass of their own.
    const mix_rows::Plan plan = mix_rows::plan_merge(
        std::is_same_v<T, bf16>,
        rows_aligned(d, {one(d_o), drecent, one(du), one(w), one(o), recent, one(gain)}), d, m);
    if constexpr (std::is_same_v<T, bf16>) {
      if (plan.rows) {
        bool distinct = true;
        for (int j = 0; j < m; ++j)
          for (int i = 0; i < j; ++i) distinct = distinct && drec.dv[i] != drec.dv[j];
        with_int<1, mix_rows::kMaxRecent>("m", m, [&](auto mn) {
          auto kernel = merge_norm_backward_rows_kernel<decltype(mn)::value>;
          const int64_t grid = partial_grid(op, kernel, plan.threads, 0, N);
          Tensor partial = Tensor::empty({2, grid, d}, DType::F32, Device::CUDA);
          kernel<<<static_cast<unsigned>(grid), plan.threads, 0, stream()>>>(
              dptr<bf16>(d_o), dptr<float>(dlse), drec, partial.data<float>(), dptr<bf16>(du),
              dptr<bf16>(w), dptr<bf16>(o), rec, dptr<bf16>(gain), dptr<float>(stats), N, d,
              distinct, set);
          ATTNRES_CUDA_CHECK_LAUNCH();
          DwPtrs grads{};
          grads.dw[0] = dptr<float>(dgain);
          grads.dw[1] = dptr<float>(dw);
          launch_dw_reduce(grads, partial.data<float>(), grid, d, 2);
        });
        return;
      }
    }
    const RowLayout lay = row_layout(op, d);
    const int groups_per_block = lay.groups_per_block(), threads = lay.threads();
    // Warp mode: the block's per-group dgain rows meet in shared memory.
    const size_t smem = lay.block_mode() ? 0 : size_t(groups_per_block) * d * sizeof(float);
    Tensor coef = Tensor::empty({N, m}, DType::F32, Device::CUDA);
    Tensor partial;
    int64_t grid = 0;
    with_variant(lay.vpt, aligned, [&](auto vpt, auto al) {
      constexpr int VPT = decltype(vpt)::value;
      constexpr bool AL = decltype(al)::value;
      auto kernel = merge_norm_backward_kernel<T, VPT, AL>;
      grid = partial_grid(op, kernel, threads, smem, ceil_div(N, groups_per_block));
      partial = Tensor::empty({grid, d}, DType::F32, Device::CUDA);
      kernel<<<static_cast<unsigned>(grid), threads, smem, stream()>>>(
          dptr<T>(d_o), dptr<float>(dlse), drec, coef.data<float>(), partial.data<float>(),
          dptr<T>(du), dptr<T>(w), dptr<T>(o), rec, m, dptr<T>(gain), dptr<float>(stats), N, d,
          lay.block_mode(), set);
      ATTNRES_CUDA_CHECK_LAUNCH();
    });
    DwPtrs dg{};
    dg.dw[0] = dptr<float>(dgain);
    launch_dw_reduce(dg, partial.data<float>(), grid, d, 1);
    DwPtrs dwp{};
    dwp.dw[0] = dptr<float>(dw);
    launch_dw<T>(dwp, coef.data<float>(), rec, 1, m, N, d, lay, rec_aligned);
  });
}

}  // namespace attnres::kernels::cuda
