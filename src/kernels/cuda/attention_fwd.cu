// CUDA causal GQA attention, forward pass (see attention.cuh for the overview).
//
// Both kernels are flash attention: a block owns a tile of query rows of one
// (batch, head), streams the key/value tiles it can see (causal: keys
// [0, last row]) through shared memory, and keeps the running max m, the
// running sum l and the output accumulator of each row on chip (online
// softmax). Only out and lse are written: memory traffic is one read of Q,
// one read of K/V per query tile (served mostly from L2; the query heads of a
// GQA group read the same K/V), one write of out. FLOPs: 4 * hd per visible
// (query, key) pair, ~2 * B * H * T^2 * hd in total.
//
// Blocks are numbered so that the longest query tiles (the last ones, which
// see the most keys) of every head are launched first, which balances the
// causal triangle's uneven work across the SMs.
//
// mma path (bf16, hd in {32, 64, 128}): each warp owns 32 query rows (two
// 16-row m-tiles; 16 for hd = 128, where registers are the limit). Q
// fragments are loaded once into registers with ldmatrix; per key tile,
// S = Q K^T runs on tensor cores (K fragments by ldmatrix from shared memory,
// each one used by both m-tiles), the softmax is done on the fp32 C fragments
// (exp2 with log2(e) folded into the scale), and P, packed to bf16 straight
// from the C registers, is multiplied by V (ldmatrix.trans). K/V tiles are
// double-buffered with cp.async so the next tile's load overlaps this tile's
// math. Warps (and m-tiles) whose rows all lie above a tile's keys skip it
// (the causal diagonal). The output is staged through shared memory and
// written with 16-byte stores. Per 64-key tile and 16 rows: 2 * 16 * 64 * hd
// * 2 FLOPs on tensor cores, 1024 exp2.
//
// Strides: q, k, v are column blocks of the joint qkv (row strides p.ldq,
// p.ldk), out is a separate [B*T, H hd] tensor (p.ldo); see Params.
//
// Generic path (fp32 math, F32 or BF16 storage, any hd <= 256): 32 x 32
// tiles, 128 threads; thread (ty, tx) = (tid / 8, tid % 8) owns query rows
// 2ty, 2ty+1 and key columns tx + 8c of the score tile, and output columns
// tx + 8c, so the softmax rescaling of its accumulators needs no exchange; row
// statistics are reduced over the 8 lanes of a row with shuffles. Shared rows
// are padded by one float so column walks hit distinct banks.
#include <algorithm>
#include <cmath>

#include "kernels/cuda/attention.cuh"

namespace attnres::kernels::cuda::attn {

namespace {

// ===================================================================================
// Generic fp32 kernel
// ===================================================================================

template <int HD>
constexpr size_t fwd_generic_smem() {
  // sQ, sK [32][HD+1]; sV [32][HD]; sP [32][33]
  return sizeof(float) * (2 * kGenTile * (HD + 1) + kGenTile * HD + kGenTile * (kGenTile + 1));
}

template <typename T, int HD>
__global__ void __launch_bounds__(kGenThreads)
    fwd_generic_kernel(Params p, T* __restrict__ out, float* __restrict__ lse,
                       const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v) {
  constexpr int BQ = kGenTile, BK = kGenTile, SR = HD + 1, NC = HD / 8;
  extern __shared__ float smem_f[];
  float* sQ = smem_f;          // [BQ][SR]
  float* sK = sQ + BQ * SR;    // [BK][SR]
  float* sV = sK + BK * SR;    // [BK][HD]
  float* sP = sV + BK * HD;    // [BQ][BK+1]

  const int hd = p.hd, T_ = p.T;
  const auto [bh, b, h, j, q0] = query_tile<BQ>(p);
  const int tid = threadIdx.x, tx = tid & 7, ty = tid >> 3;

  const T* qg = q + (int64_t(b) * T_ + q0) * p.ldq + int64_t(h) * hd;
  const T* kg = k + int64_t(b) * T_ * p.ldk + int64_t(j) * hd;
  const T* vg = v + int64_t(b) * T_ * p.ldk + int64_t(j) * hd;

  for (int i = tid; i < BQ * hd; i += kGenThreads) {
    const int r = i / hd, c = i - r * hd;
    sQ[r * SR + c] = q0 + r < T_ ? to_f32(qg[r * p.ldq + c]) : 0.f;
  }

  float o[2][NC] = {};
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};

  const int nkt = visible_key_tiles<BQ, BK>(q0, T_);
  for (int kt = 0; kt < nkt; ++kt) {
    const int k0 = kt * BK;
    __syncthreads();  // the previous tile's sK/sV/sP readers are done
    for (int i = tid; i < BK * hd; i += kGenThreads) {
      const int r = i / hd, c = i - r * hd;
      const bool ok = k0 + r < T_;
      const int64_t off = int64_t(k0 + r) * p.ldk + c;
      sK[r * SR + c] = ok ? to_f32(kg[off]) : 0.f;
      sV[r * HD + c] = ok ? to_f32(vg[off]) : 0.f;
    }
    __syncthreads();

    // S = Q K^T for rows 2ty+i, keys tx+8c.
    float s[2][4] = {};
    for (int d = 0; d < hd; ++d) {
      const float a0 = sQ[(2 * ty) * SR + d], a1 = sQ[(2 * ty + 1) * SR + d];
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const float kv = sK[(tx + 8 * c) * SR + d];
        s[0][c] = fmaf(a0, kv, s[0][c]);
        s[1][c] = fmaf(a1, kv, s[1][c]);
      }
    }

    // Online softmax per row; masked keys (after the row) get probability 0.
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int row = q0 + 2 * ty + i;
      float mx = -INFINITY;
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        s[i][c] = k0 + tx + 8 * c <= row ? s[i][c] * p.scale : -INFINITY;
        mx = fmaxf(mx, s[i][c]);
      }
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 4));
      const float m_new = fmaxf(m[i], mx);
      // The first tile holds key 0, which every row sees, so m_new is finite
      // from then on; the guard only keeps exp(-inf - -inf) out of the picture.
      const float base = m_new == -INFINITY ? 0.f : m_new;
      const float corr = expf(m[i] - base);
      m[i] = m_new;
      float sum = 0.f;
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const float pr = expf(s[i][c] - base);
        sum += pr;
        sP[(2 * ty + i) * (BK + 1) + tx + 8 * c] = pr;
      }
      l[i] = l[i] * corr + sum;  // this thread's columns only; reduced at the end
#pragma unroll
      for (int c = 0; c < NC; ++c) o[i][c] *= corr;
    }
    __syncthreads();

    // O += P V over output columns tx + 8c.
    acc_2xNC<NC, HD>(o, sP, sV, hd, ty, tx);
  }

#pragma unroll
  for (int i = 0; i < 2; ++i) {
    l[i] += __shfl_xor_sync(0xffffffffu, l[i], 1);
    l[i] += __shfl_xor_sync(0xffffffffu, l[i], 2);
    l[i] += __shfl_xor_sync(0xffffffffu, l[i], 4);
    const int row = q0 + 2 * ty + i;
    if (row < T_) {
      const float inv = 1.f / l[i];
      // out has its own row stride (ldo = H hd): q's (ldq) is the joint qkv's.
      T* orow = out + (int64_t(b) * T_ + row) * p.ldo + int64_t(h) * hd;
#pragma unroll
      for (int c = 0; c < NC; ++c)
        if (tx + 8 * c < hd) orow[tx + 8 * c] = from_f32<T>(o[i][c] * inv);
      if (tx == 0) lse[int64_t(bh) * T_ + row] = m[i] + logf(l[i]);
    }
  }
}

template <typename T, int HD>
void launch_fwd_generic(const Params& p, T* out, float* lse, const T* q, const T* k,
                        const T* v) {
  const size_t smem = fwd_generic_smem<HD>();
  auto kernel = fwd_generic_kernel<T, HD>;
  allow_smem(kernel, smem);
  const int64_t blocks = ceil_div(p.T, kGenTile) * p.B * p.H;
  kernel<<<static_cast<unsigned>(blocks), kGenThreads, smem, stream()>>>(p, out, lse, q, k, v);
  ATTNRES_CUDA_CHECK_LAUNCH();
}

// ===================================================================================
// Tensor-core kernel (bf16)
// ===================================================================================

template <int D, int NW, int MT, int BK>
constexpr size_t fwd_mma_smem() {
  // sQ [NW*16*MT][SR] + double-buffered sK, sV [2][BK][SR]
  return sizeof(bf16) * (NW * 16 * MT + 4 * BK) * smem_row<D>();
}

// NW warps, each owning MT m-tiles of 16 query rows (BQ = NW * 16 * MT rows
// per block); BK keys per K/V tile. With MT = 2 every K/V fragment loaded from
// shared memory feeds four mma instead of two, which halves the shared-memory
// traffic per FLOP (ldmatrix bandwidth, not the tensor cores, bounds a warp
// that owns only 16 rows).
template <int D, int NW, int MT, int BK>
__global__ void __launch_bounds__(NW * 32)
    fwd_mma_kernel(Params p, bf16* __restrict__ out, float* __restrict__ lse,
                   const bf16* __restrict__ q, const bf16* __restrict__ k,
                   const bf16* __restrict__ v) {
  constexpr int BQ = NW * 16 * MT, WR = 16 * MT, NT = NW * 32, SR = smem_row<D>();
  static_assert(D % 16 == 0 && BK % 16 == 0, "tile shapes");
  extern __shared__ __align__(16) unsigned char smem_raw[];
  bf16* sQ = reinterpret_cast<bf16*>(smem_raw);  // [BQ][SR]
  bf16* sK = sQ + BQ * SR;                        // [2][BK][SR]
  bf16* sV = sK + 2 * BK * SR;                    // [2][BK][SR]

  const int T_ = p.T;
  const auto [bh, b, h, j, q0] = query_tile<BQ>(p);
  const auto [warp, lane, g, tig] = frag_lane();

  const bf16* qg = q + (int64_t(b) * T_ + q0) * p.ldq + int64_t(h) * D;
  const int nkt = visible_key_tiles<BQ, BK>(q0, T_);
  const auto issue = kv_tile_issuer<BK, D, NT>(sK, sV, k, v, p, b, j);

  // Group 0: the Q tile and the first K/V tile.
  load_tile_async<BQ, D, NT>(sQ, qg, p.ldq, T_ - q0);
  issue(0, 0);
  cp_async_commit();

  // Rows of m-tile mt: wq0 + 16 mt + g (C elements 0, 1) and + 8 (elements 2, 3).
  const int wq0 = q0 + warp * WR;
  const float sl2 = p.scale * kLog2e;  // exp(scale (s - m)) = exp2(sl2 s - sl2 m)
  float o[MT][D / 8][4];
  float m[MT][2], l[MT][2];
  zero_frags(o);
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
    m[mt][0] = m[mt][1] = -INFINITY;
    l[mt][0] = l[mt][1] = 0.f;
  }
  uint32_t qf[MT][D / 16][4];

  // K for S = Q K^T is an [n][k] tile, V for O = P V a [k][n] tile (.trans).
  const LdsmOffsets<SR> off(lane);

  for (int it = 0; it < nkt; ++it) {
    const int st = it & 1;
    pipeline_wait(it, nkt, issue);  // with the prefetch of the next K/V tile
    if (it == 0) {
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk)
          ldsm_x4(qf[mt][kk], smem_u32(sQ + (warp * WR + mt * 16) * SR + off.a + kk * 16));
    }

    const int k0 = it * BK;
    // Skip the tile when all of this warp's rows precede its first key, or
    // when the warp's rows are all past the end of the sequence; likewise,
    // per m-tile, skip the math of an m-tile whose rows all precede the tile.
    bool live[MT];
    if (live_row_tiles(live, k0, wq0, T_)) {
      const bf16* sKs = sK + st * BK * SR;
      const bf16* sVs = sV + st * BK * SR;

      float s[MT][BK / 8][4];
      uint32_t qa[MT][4];
      mma_abt<MT, BK, D, SR>(s, qa, reg_frags(qf), sKs, off.bn, live);

      uint32_t pa[MT][BK / 16][4];  // P as bf16 A fragments
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        if (!live[mt]) continue;
        const int row0 = wq0 + mt * 16 + g, row1 = row0 + 8;
        // Causal mask, only on tiles that reach past the m-tile's first row.
        // (Keys >= T need no mask of their own: for a row < T they come
        // after the row; rows >= T are never written.)
        if (k0 + BK - 1 > wq0 + mt * 16) {
#pragma unroll
          for (int n = 0; n < BK / 8; ++n) {
            const int key = k0 + n * 8 + tig * 2;
            if (key > row0) s[mt][n][0] = -INFINITY;
            if (key + 1 > row0) s[mt][n][1] = -INFINITY;
            if (key > row1) s[mt][n][2] = -INFINITY;
            if (key + 1 > row1) s[mt][n][3] = -INFINITY;
          }
        }
        // Online softmax. A row's scores are spread over the 4 lanes of a
        // quad (same g), so row maxima are reduced with two shuffles.
        float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
        for (int n = 0; n < BK / 8; ++n) {
          mx0 = fmaxf(mx0, fmaxf(s[mt][n][0], s[mt][n][1]));
          mx1 = fmaxf(mx1, fmaxf(s[mt][n][2], s[mt][n][3]));
        }
        mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
        mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
        mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
        mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
        // Every processed row sees key 0 in the first tile, so the running
        // max is finite from then on; the guard keeps -inf - -inf out.
        const float mn0 = fmaxf(m[mt][0], mx0), mn1 = fmaxf(m[mt][1], mx1);
        const float base0 = mn0 == -INFINITY ? 0.f : mn0 * sl2;
        const float base1 = mn1 == -INFINITY ? 0.f : mn1 * sl2;
        const float corr0 = fast_exp2(m[mt][0] * sl2 - base0);
        const float corr1 = fast_exp2(m[mt][1] * sl2 - base1);
        m[mt][0] = mn0;
        m[mt][1] = mn1;
        float sum0 = 0.f, sum1 = 0.f;
#pragma unroll
        for (int n = 0; n < BK / 8; ++n) {
          s[mt][n][0] = fast_exp2(fmaf(s[mt][n][0], sl2, -base0));
          s[mt][n][1] = fast_exp2(fmaf(s[mt][n][1], sl2, -base0));
          s[mt][n][2] = fast_exp2(fmaf(s[mt][n][2], sl2, -base1));
          s[mt][n][3] = fast_exp2(fmaf(s[mt][n][3], sl2, -base1));
          sum0 += s[mt][n][0] + s[mt][n][1];
          sum1 += s[mt][n][2] + s[mt][n][3];
        }
        l[mt][0] = l[mt][0] * corr0 + sum0;  // per-lane partial sums; quads reduced at the end
        l[mt][1] = l[mt][1] * corr1 + sum1;
#pragma unroll
        for (int n = 0; n < D / 8; ++n) {
          o[mt][n][0] *= corr0;
          o[mt][n][1] *= corr0;
          o[mt][n][2] *= corr1;
          o[mt][n][3] *= corr1;
        }
#pragma unroll
        for (int kk = 0; kk < BK / 16; ++kk) c_to_a(pa[mt][kk], s[mt][2 * kk], s[mt][2 * kk + 1]);
      }

      // O += P V: P (bf16) comes straight from the S registers.
      uint32_t a[MT][4];
      mma_ab_acc<MT, BK, D, SR>(o, a, reg_frags(pa), sVs, off.bt, live);
    }
    __syncthreads();  // the stage read here is refilled by the next iteration's prefetch
  }

  // Epilogue: finish the row sums over the quads, normalise, write lse and O.
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      l[mt][r] += __shfl_xor_sync(0xffffffffu, l[mt][r], 1);
      l[mt][r] += __shfl_xor_sync(0xffffffffu, l[mt][r], 2);
    }
  if (wq0 >= T_) return;  // nothing of this warp's to write (warp-uniform)
  // Stage the warp's WR x D output in its own rows of sQ (no other warp reads
  // them after the loop), then store whole 16-byte row pieces.
  bf16* so = sQ + warp * WR * SR;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
    const int row0 = wq0 + mt * 16 + g, row1 = row0 + 8;
    const float inv0 = 1.f / l[mt][0], inv1 = 1.f / l[mt][1];
    if (tig == 0) {
      if (row0 < T_) lse[int64_t(bh) * T_ + row0] = m[mt][0] * p.scale + logf(l[mt][0]);
      if (row1 < T_) lse[int64_t(bh) * T_ + row1] = m[mt][1] * p.scale + logf(l[mt][1]);
    }
    bf16* r0 = so + (mt * 16 + g) * SR + tig * 2;
    bf16* r1 = r0 + 8 * SR;
#pragma unroll
    for (int n = 0; n < D / 8; ++n) {
      *reinterpret_cast<uint32_t*>(r0 + n * 8) = pack_bf16(o[mt][n][0] * inv0, o[mt][n][1] * inv0);
      *reinterpret_cast<uint32_t*>(r1 + n * 8) = pack_bf16(o[mt][n][2] * inv1, o[mt][n][3] * inv1);
    }
  }
  __syncwarp();
  constexpr int kChunks = D / 8;
#pragma unroll
  for (int i = lane; i < WR * kChunks; i += 32) {
    const int r = i / kChunks, c = i % kChunks;
    if (wq0 + r < T_)
      // Row stride ldo (out is [B*T, H hd]), not ldq (q's rows in the joint qkv).
      *reinterpret_cast<uint4*>(out + (int64_t(b) * T_ + wq0 + r) * p.ldo + int64_t(h) * D + c * 8) =
          *reinterpret_cast<const uint4*>(so + r * SR + c * 8);
  }
}

template <int D, int NW, int MT, int BK>
void launch_fwd_mma(const Params& p, bf16* out, float* lse, const bf16* q, const bf16* k,
                    const bf16* v) {
  constexpr int BQ = NW * 16 * MT;
  constexpr size_t smem = fwd_mma_smem<D, NW, MT, BK>();
  auto kernel = fwd_mma_kernel<D, NW, MT, BK>;
  allow_smem(kernel, smem);
  const int64_t blocks = ceil_div(p.T, BQ) * p.B * p.H;
  kernel<<<static_cast<unsigned>(blocks), NW * 32, smem, stream()>>>(p, out, lse, q, k, v);
  ATTNRES_CUDA_CHECK_LAUNCH();
}

}  // namespace

template <typename T>
void forward_generic(const Params& p, T* out, float* lse, const T* q, const T* k, const T* v) {
  if (p.hd <= 32) launch_fwd_generic<T, 32>(p, out, lse, q, k, v);
  else if (p.hd <= 64) launch_fwd_generic<T, 64>(p, out, lse, q, k, v);
  else if (p.hd <= 128) launch_fwd_generic<T, 128>(p, out, lse, q, k, v);
  else launch_fwd_generic<T, 256>(p, out, lse, q, k, v);
}
template void forward_generic<float>(const Params&, float*, float*, const float*, const float*,
                                     const float*);
template void forward_generic<bf16>(const Params&, bf16*, float*, const bf16*, const bf16*,
                                    const bf16*);

void forward_mma(const Params& p, bf16* out, float* lse, const bf16* q, const bf16* k,
                 const bf16* v) {
  // 4 warps of 32 query rows (two m-tiles) for hd <= 64; for hd = 128 the
  // accumulators alone take 64 registers per m-tile, so 4 warps of 16 rows.
  switch (p.hd) {
    case 32: launch_fwd_mma<32, 4, 2, 64>(p, out, lse, q, k, v); break;
    case 64: launch_fwd_mma<64, 4, 2, 64>(p, out, lse, q, k, v); break;
    case 128: launch_fwd_mma<128, 4, 1, 64>(p, out, lse, q, k, v); break;
    default: fail("attention forward: no tensor-core kernel for head dim ", p.hd);
  }
}

}  // namespace attnres::kernels::cuda::attn
