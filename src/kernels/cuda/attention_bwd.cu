// CUDA causal GQA attention, backward pass (see attention.cuh for the overview).
//
// With P = softmax(scale Q K^T) (recomputed from the saved lse), O = P V:
//   dV = P^T dO,  dP = dO V^T,  dS = P * (dP - D), D_i = dO_i . O_i,
//   dQ = scale dS K,  dK = scale dS^T Q.
// Three kernels, FlashAttention-2 style, none with atomics (deterministic):
// 1. preprocess: D_i per query row, and lse copied into a [B*H, Tpad] layout
//    padded with lse = +inf (so padding rows get probability 0), scaled by
//    log2(e) for the exp2-based mma kernels. Reads dO and O once.
// 2. dK/dV: a block owns a key tile of one (batch, KV head) and loops over
//    the group's query heads (in order) and the query tiles that can see the
//    keys, so the GQA sum happens in registers in a fixed order and each dk/dv
//    element has one writer. Per (query tile) it computes the transposed
//    products S^T = K Q^T and dP^T = V dO^T, so P^T and dS^T come out with
//    keys as rows -- exactly the A operand of dV += P^T dO and dK += dS^T Q.
// 3. dQ: a block owns a query tile of one (batch, head), loops over the key
//    tiles it can see and accumulates dQ += dS K.
// S and dP are computed twice (in 2. and 3.), the price of having no atomics
// and no T x T matrix: 7 matmuls of 2 * hd FLOPs per visible (query, key)
// pair (S, dP, dV, dK in 2.; S, dP, dQ in 3.), 3.5x the forward's 2.
// Memory traffic: kernel 2 streams Q, dO (and D, lse) once per key tile,
// kernel 3 streams K, V once per query tile (mostly L2 hits); the gradients
// are written once (read too when they accumulate: +=, Params::accumulate).
//
// mma path (bf16, hd in {32, 64, 128}): a warp owns 32 keys (dK/dV) or 32
// query rows (dQ) as two 16-row m-tiles (16 rows for hd = 128, where the
// accumulators fill the registers), so each B fragment read from shared
// memory by ldmatrix feeds both m-tiles; shared memory, not the tensor cores,
// is the bottleneck of one-m-tile warps. Q/dO (resp. K/V) tiles are
// double-buffered with cp.async; P and dS are packed to bf16 from the fp32 C
// fragments and fed back to the tensor cores without touching shared memory.
// Warps and m-tiles skip tiles that are entirely masked for them. Block
// order: the tiles with the most work first (early key tiles for dK/dV, late
// query tiles for dQ).
//
// Strides: q, k, v and dq, dk, dv are column blocks of the joint qkv / dqkv
// (row strides p.ldq = p.ldk); out and dout are separate [B*T, H hd] tensors
// (p.ldo). A query row therefore has two offsets, one for q/dq, one for
// out/dout (see Params).
//
// Generic path (fp32 math): 32 x 32 tiles, 128 threads as 16 x 8; thread
// (ty, tx) owns rows 2ty, 2ty+1 of the tile's 32 x 32 score block and columns
// tx + 8c; P and dS go through shared memory for the second product.
#include <algorithm>
#include <cmath>

#include "kernels/cuda/attention.cuh"

namespace attnres::kernels::cuda::attn {

namespace {

// ===================================================================================
// Preprocess: D = rowsum(dO * O), padded lse
// ===================================================================================

constexpr int kPreThreads = 256;

// One warp per (batch, head, padded row): a warp-wide dot product over hd.
template <typename T>
__global__ void __launch_bounds__(kPreThreads)
    bwd_preprocess_kernel(Params p, int Tpad, float lse_mult, float* __restrict__ Dsc,
                          float* __restrict__ Lsc, const T* __restrict__ dout,
                          const T* __restrict__ out, const float* __restrict__ lse) {
  const int64_t row = (int64_t(blockIdx.x) * kPreThreads + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  if (row >= int64_t(p.B) * p.H * Tpad) return;  // whole warps leave together
  const int64_t bh = row / Tpad;
  const int t = static_cast<int>(row - bh * Tpad);
  if (t >= p.T) {
    if (lane == 0) {
      Dsc[row] = 0.f;
      Lsc[row] = INFINITY;
    }
    return;
  }
  const int64_t b = bh / p.H, h = bh % p.H;
  // dout and out are both [B*T, H hd]: row stride ldo (ldq is q's, in the joint qkv).
  const int64_t off = (b * p.T + t) * p.ldo + h * p.hd;
  float acc = 0.f;
  for (int d = lane; d < p.hd; d += 32) acc = fmaf(to_f32(dout[off + d]), to_f32(out[off + d]), acc);
  acc = warp_sum(acc);
  if (lane == 0) {
    Dsc[row] = acc;
    Lsc[row] = lse[bh * p.T + t] * lse_mult;
  }
}

// Scratch [2, B*H*Tpad]: D then lse (scaled by lse_mult), both F32.
template <typename T>
Tensor preprocess(const Params& p, const T* dout, const T* out, const float* lse, float lse_mult) {
  const int64_t Tpad = padded_rows(p.T);
  const int64_t rows = int64_t(p.B) * p.H * Tpad;
  Tensor scratch = Tensor::empty({2, rows}, DType::F32, Device::CUDA);
  float* Dsc = static_cast<float*>(scratch.raw());
  const int64_t blocks = ceil_div(rows * 32, kPreThreads);
  bwd_preprocess_kernel<T><<<static_cast<unsigned>(blocks), kPreThreads, 0, stream()>>>(
      p, static_cast<int>(Tpad), lse_mult, Dsc, Dsc + rows, dout, out, lse);
  ATTNRES_CUDA_CHECK_LAUNCH();
  return scratch;
}

// ===================================================================================
// Generic fp32 kernels
// ===================================================================================

template <int HD>
constexpr size_t dkdv_generic_smem() {
  // sK, sV, sQ, sdO [32][HD+1]; sP, sS [32][33]; sL, sD [32]
  return sizeof(float) *
         (4 * kGenTile * (HD + 1) + 2 * kGenTile * (kGenTile + 1) + 2 * kGenTile);
}
template <int HD>
constexpr size_t dq_generic_smem() {
  // sQ, sdO, sK, sV [32][HD+1]; sS [32][33]
  return sizeof(float) * (4 * kGenTile * (HD + 1) + kGenTile * (kGenTile + 1));
}

// Loads rows [r0, r0 + 32) of one head (hd columns, row stride ld) as fp32,
// zeros for rows >= T.
template <typename T, int SR>
__device__ __forceinline__ void load_rows_f32(float* s, const T* g, int64_t ld, int r0, int T_,
                                              int hd) {
  for (int i = threadIdx.x; i < kGenTile * hd; i += kGenThreads) {
    const int r = i / hd, c = i - r * hd;
    s[r * SR + c] = r0 + r < T_ ? to_f32(g[int64_t(r0 + r) * ld + c]) : 0.f;
  }
}

template <typename T, int HD>
__global__ void __launch_bounds__(kGenThreads)
    dkdv_generic_kernel(Params p, int Tpad, T* __restrict__ dk, T* __restrict__ dv,
                        const T* __restrict__ q, const T* __restrict__ k,
                        const T* __restrict__ v, const T* __restrict__ dout,
                        const float* __restrict__ Dsc, const float* __restrict__ Lsc) {
  constexpr int BQ = kGenTile, BK = kGenTile, SR = HD + 1, NC = HD / 8, PR = kGenTile + 1;
  extern __shared__ float smem_f[];
  float* sK = smem_f;
  float* sV = sK + BK * SR;
  float* sQ = sV + BK * SR;
  float* sdO = sQ + BQ * SR;
  float* sP = sdO + BQ * SR;  // P^T [key][query]
  float* sS = sP + BK * PR;   // dS^T [key][query]
  float* sL = sS + BK * PR;
  float* sD = sL + BQ;

  const int hd = p.hd, T_ = p.T;
  const KeyTile tile = key_tile<BK>(p);
  const int b = tile.b, j = tile.j, kt = tile.kt, k0 = tile.k0;
  const int tid = threadIdx.x, tx = tid & 7, ty = tid >> 3;
  const int kr0 = 2 * ty, kr1 = 2 * ty + 1;  // this thread's key rows in the tile

  const int64_t kvoff = int64_t(b) * T_ * p.ldk + int64_t(j) * hd;
  load_rows_f32<T, SR>(sK, k + kvoff, p.ldk, k0, T_, hd);
  load_rows_f32<T, SR>(sV, v + kvoff, p.ldk, k0, T_, hd);

  float dka[2][NC] = {}, dva[2][NC] = {};

  const int nqt = (T_ + BQ - 1) / BQ;
  for (int h = j * p.group; h < (j + 1) * p.group; ++h) {
    // q lives in the joint qkv (row stride ldq), dout is [B*T, H hd] (ldo):
    // each gets its own offset.
    const int64_t qoff = int64_t(b) * T_ * p.ldq + int64_t(h) * hd;
    const int64_t ooff = int64_t(b) * T_ * p.ldo + int64_t(h) * hd;
    const int64_t soff = (int64_t(b) * p.H + h) * Tpad;
    for (int qt = kt; qt < nqt; ++qt) {  // query tiles at or after the key tile
      const int q0 = qt * BQ;
      __syncthreads();  // previous readers of sQ/sdO/sP/sS are done
      load_rows_f32<T, SR>(sQ, q + qoff, p.ldq, q0, T_, hd);
      load_rows_f32<T, SR>(sdO, dout + ooff, p.ldo, q0, T_, hd);
      if (tid < BQ) {
        sL[tid] = Lsc[soff + q0 + tid];
        sD[tid] = Dsc[soff + q0 + tid];
      }
      __syncthreads();

      // S^T = K Q^T and dP^T = V dO^T for keys kr0/kr1, queries tx + 8c.
      float s[2][4] = {}, dp[2][4] = {};
      dots_2x4_pair<SR>(s, dp, sK, sQ, sV, sdO, hd, ty, tx);
#pragma unroll
      for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          const int qi = tx + 8 * c, key = k0 + 2 * ty + i, qq = q0 + qi;
          const float pr = key <= qq && qq < T_ ? expf(s[i][c] * p.scale - sL[qi]) : 0.f;
          sP[(2 * ty + i) * PR + qi] = pr;
          sS[(2 * ty + i) * PR + qi] = pr * (dp[i][c] - sD[qi]);
        }
      __syncthreads();

      // dV += P^T dO, dK += dS^T Q over output columns tx + 8c.
      for (int qi = 0; qi < BQ; ++qi) {
        const float p0 = sP[kr0 * PR + qi], p1 = sP[kr1 * PR + qi];
        const float s0 = sS[kr0 * PR + qi], s1 = sS[kr1 * PR + qi];
#pragma unroll
        for (int c = 0; c < NC; ++c) {
          const int col = tx + 8 * c;
          if (col < hd) {
            const float ov = sdO[qi * SR + col], qv = sQ[qi * SR + col];
            dva[0][c] = fmaf(p0, ov, dva[0][c]);
            dva[1][c] = fmaf(p1, ov, dva[1][c]);
            dka[0][c] = fmaf(s0, qv, dka[0][c]);
            dka[1][c] = fmaf(s1, qv, dka[1][c]);
          }
        }
      }
    }
  }

#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int key = k0 + 2 * ty + i;
    if (key >= T_) continue;
    T* dkr = dk + kvoff + int64_t(key) * p.ldk;
    T* dvr = dv + kvoff + int64_t(key) * p.ldk;
#pragma unroll
    for (int c = 0; c < NC; ++c) {
      const int col = tx + 8 * c;
      if (col < hd) {
        put(dkr + col, dka[i][c] * p.scale, p.accumulate);
        put(dvr + col, dva[i][c], p.accumulate);
      }
    }
  }
}

template <typename T, int HD>
__global__ void __launch_bounds__(kGenThreads)
    dq_generic_kernel(Params p, int Tpad, T* __restrict__ dq, const T* __restrict__ q,
                      const T* __restrict__ k, const T* __restrict__ v,
                      const T* __restrict__ dout, const float* __restrict__ Dsc,
                      const float* __restrict__ Lsc) {
  constexpr int BQ = kGenTile, BK = kGenTile, SR = HD + 1, NC = HD / 8, PR = kGenTile + 1;
  extern __shared__ float smem_f[];
  float* sQ = smem_f;
  float* sdO = sQ + BQ * SR;
  float* sK = sdO + BQ * SR;
  float* sV = sK + BK * SR;
  float* sS = sV + BK * SR;  // dS [query][key]

  const int hd = p.hd, T_ = p.T;
  const auto [bh, b, h, j, q0] = query_tile<BQ>(p);
  const int tid = threadIdx.x, tx = tid & 7, ty = tid >> 3;

  // q and dq live in the joint qkv / dqkv (row stride ldq), dout is
  // [B*T, H hd] (ldo): separate offsets.
  const int64_t qoff = int64_t(b) * T_ * p.ldq + int64_t(h) * hd;
  const int64_t ooff = int64_t(b) * T_ * p.ldo + int64_t(h) * hd;
  const int64_t kvoff = int64_t(b) * T_ * p.ldk + int64_t(j) * hd;
  load_rows_f32<T, SR>(sQ, q + qoff, p.ldq, q0, T_, hd);
  load_rows_f32<T, SR>(sdO, dout + ooff, p.ldo, q0, T_, hd);
  float Lr[2], Dr[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    Lr[i] = Lsc[int64_t(bh) * Tpad + q0 + 2 * ty + i];
    Dr[i] = Dsc[int64_t(bh) * Tpad + q0 + 2 * ty + i];
  }

  float acc[2][NC] = {};

  const int nkt = visible_key_tiles<BQ, BK>(q0, T_);
  for (int kt = 0; kt < nkt; ++kt) {
    const int k0 = kt * BK;
    __syncthreads();  // previous readers of sK/sV/sS are done (and sQ/sdO are visible)
    load_rows_f32<T, SR>(sK, k + kvoff, p.ldk, k0, T_, hd);
    load_rows_f32<T, SR>(sV, v + kvoff, p.ldk, k0, T_, hd);
    __syncthreads();

    // S = Q K^T and dP = dO V^T for rows 2ty+i, keys tx + 8c.
    float s[2][4] = {}, dp[2][4] = {};
    dots_2x4_pair<SR>(s, dp, sQ, sK, sdO, sV, hd, ty, tx);
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const int row = q0 + 2 * ty + i, key = k0 + tx + 8 * c;
        const float pr = key <= row && row < T_ ? expf(s[i][c] * p.scale - Lr[i]) : 0.f;
        sS[(2 * ty + i) * PR + tx + 8 * c] = pr * (dp[i][c] - Dr[i]);
      }
    __syncthreads();

    // dQ += dS K over output columns tx + 8c.
    acc_2xNC<NC, SR>(acc, sS, sK, hd, ty, tx);
  }

#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int row = q0 + 2 * ty + i;
    if (row >= T_) continue;
    T* dqr = dq + qoff + int64_t(row) * p.ldq;  // dq: q's layout in dqkv (ldq)
#pragma unroll
    for (int c = 0; c < NC; ++c) {
      const int col = tx + 8 * c;
      if (col < hd) put(dqr + col, acc[i][c] * p.scale, p.accumulate);
    }
  }
}

template <typename T, int HD>
void launch_bwd_generic(const Params& p, int Tpad, T* dq, T* dk, T* dv, const T* dout,
                        const T* q, const T* k, const T* v, const float* Dsc,
                        const float* Lsc) {
  {
    const size_t smem = dkdv_generic_smem<HD>();
    auto kernel = dkdv_generic_kernel<T, HD>;
    allow_smem(kernel, smem);
    const int64_t blocks = ceil_div(p.T, kGenTile) * p.B * p.Hkv;
    kernel<<<static_cast<unsigned>(blocks), kGenThreads, smem, stream()>>>(p, Tpad, dk, dv, q, k,
                                                                           v, dout, Dsc, Lsc);
    ATTNRES_CUDA_CHECK_LAUNCH();
  }
  {
    const size_t smem = dq_generic_smem<HD>();
    auto kernel = dq_generic_kernel<T, HD>;
    allow_smem(kernel, smem);
    const int64_t blocks = ceil_div(p.T, kGenTile) * p.B * p.H;
    kernel<<<static_cast<unsigned>(blocks), kGenThreads, smem, stream()>>>(p, Tpad, dq, q, k, v,
                                                                           dout, Dsc, Lsc);
    ATTNRES_CUDA_CHECK_LAUNCH();
  }
}

// ===================================================================================
// Tensor-core kernels (bf16)
// ===================================================================================

template <int D, int NW, int MT, int BQ>
constexpr size_t dkdv_mma_smem() {
  // sK, sV [BK][SR]; sQ, sdO [2][BQ][SR]; sL, sD [2][BQ] floats
  return sizeof(bf16) * (2 * NW * 16 * MT + 4 * BQ) * smem_row<D>() + sizeof(float) * 4 * BQ;
}

// Block: one key tile of one (batch, KV head): NW warps, each owning MT
// m-tiles of 16 keys (BK = NW * 16 * MT keys). Query tiles of BQ rows.
template <int D, int NW, int MT, int BQ>
__global__ void __launch_bounds__(NW * 32)
    dkdv_mma_kernel(Params p, int Tpad, bf16* __restrict__ dk, bf16* __restrict__ dv,
                    const bf16* __restrict__ q, const bf16* __restrict__ k,
                    const bf16* __restrict__ v, const bf16* __restrict__ dout,
                    const float* __restrict__ Dsc, const float* __restrict__ Lsc) {
  constexpr int BK = NW * 16 * MT, WK = 16 * MT, NT = NW * 32, SR = smem_row<D>();
  static_assert(BQ / 4 * 2 <= NT, "one 16-byte lse/D chunk per thread");
  extern __shared__ __align__(16) unsigned char smem_raw[];
  bf16* sK = reinterpret_cast<bf16*>(smem_raw);  // [BK][SR]
  bf16* sV = sK + BK * SR;                        // [BK][SR]
  bf16* sQ = sV + BK * SR;                        // [2][BQ][SR]
  bf16* sdO = sQ + 2 * BQ * SR;                   // [2][BQ][SR]
  float* sL = reinterpret_cast<float*>(sdO + 2 * BQ * SR);  // [2][BQ]
  float* sD = sL + 2 * BQ;                                  // [2][BQ]

  const int T_ = p.T;
  const KeyTile tile = key_tile<BK>(p);
  const int b = tile.b, j = tile.j, k0 = tile.k0;
  const auto [warp, lane, g, tig] = frag_lane();
  const LdsmOffsets<SR> off(lane);

  const int64_t kvoff = int64_t(b) * T_ * p.ldk + int64_t(j) * D;
  load_tile_async<BK, D, NT>(sK, k + kvoff + int64_t(k0) * p.ldk, p.ldk, T_ - k0);
  load_tile_async<BK, D, NT>(sV, v + kvoff + int64_t(k0) * p.ldk, p.ldk, T_ - k0);

  // Work list: the group's query heads in order, each with the query tiles
  // from the one holding key k0 to the last.
  const int qt_begin = k0 / BQ;
  const int nq = (T_ + BQ - 1) / BQ - qt_begin;
  const int n_it = p.group * nq;
  auto issue = [&](int it, int stage) {
    const int h = j * p.group + it / nq;
    const int q0 = (qt_begin + it % nq) * BQ;
    // q: joint qkv rows (ldq); dout: its own [B*T, H hd] rows (ldo).
    const int64_t qoff = (int64_t(b) * T_ + q0) * p.ldq + int64_t(h) * D;
    const int64_t ooff = (int64_t(b) * T_ + q0) * p.ldo + int64_t(h) * D;
    load_tile_async<BQ, D, NT>(sQ + stage * BQ * SR, q + qoff, p.ldq, T_ - q0);
    load_tile_async<BQ, D, NT>(sdO + stage * BQ * SR, dout + ooff, p.ldo, T_ - q0);
    const int64_t soff = (int64_t(b) * p.H + h) * Tpad + q0;  // in bounds: q0 + BQ <= Tpad
    const int t = threadIdx.x;
    if (t < BQ / 4) cp_async16(smem_u32(sL + stage * BQ + 4 * t), Lsc + soff + 4 * t, true);
    else if (t < BQ / 2)
      cp_async16(smem_u32(sD + stage * BQ + 4 * (t - BQ / 4)), Dsc + soff + 4 * (t - BQ / 4), true);
  };
  issue(0, 0);
  cp_async_commit();

  const float sl2 = p.scale * kLog2e;
  const int wk0 = k0 + warp * WK;  // this warp's first key; m-tile mt: keys wk0 + 16 mt + [0, 16)
  float dka[MT][D / 8][4], dva[MT][D / 8][4];
  zero_frags(dka);
  zero_frags(dva);

  for (int it = 0; it < n_it; ++it) {
    const int st = it & 1;
    pipeline_wait(it, n_it, issue);

    const int q0 = (qt_begin + it % nq) * BQ;
    // Skip when every query of the tile precedes this warp's first key, or the
    // warp's keys are all past the end of the sequence (and likewise per m-tile).
    if (q0 + BQ - 1 >= wk0 && wk0 < T_) {
      const bf16* sQs = sQ + st * BQ * SR;
      const bf16* sdOs = sdO + st * BQ * SR;
      const float* sLs = sL + st * BQ;
      const float* sDs = sD + st * BQ;
      bool live[MT];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) live[mt] = q0 + BQ - 1 >= wk0 + mt * 16 && wk0 + mt * 16 < T_;

      // Four phases, so that S^T and dP^T are never in registers together
      // with their operands (this kernel is at the register limit):
      // 1. S^T = K Q^T, then P^T in place; 2. dV += P^T dO; 3. dP^T = V dO^T,
      // then dS^T in place; 4. dK += dS^T Q. The B operands come from the
      // Q / dO tiles ([query][d]; .trans where d is the n dimension).
      float s[MT][BQ / 8][4], dp[MT][BQ / 8][4];
      uint32_t ka[MT][4];
      mma_abt<MT, BQ, D, SR>(s, ka, smem_frags<MT, SR>(sK, warp * WK, off.a, live), sQs, off.bn,
                             live);
      // P^T = exp2(sl2 S^T - lse2) (0 for padding queries: lse2 = +inf), with
      // the causal mask where the tile reaches below the m-tile's keys.
      // Elements 0, 1 of n-block n: key key0, query columns n*8 + 2*tig + {0, 1};
      // elements 2, 3: key key0 + 8, same columns.
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        if (!live[mt]) continue;
        const int key0 = wk0 + mt * 16 + g;
        const bool need_mask = wk0 + mt * 16 + 15 > q0;
#pragma unroll
        for (int n = 0; n < BQ / 8; ++n) {
          const int qi = n * 8 + tig * 2;
          const float2 L = *reinterpret_cast<const float2*>(sLs + qi);
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int key = key0 + (e >> 1) * 8, qq = q0 + qi + (e & 1);
            const float pr = fast_exp2(fmaf(s[mt][n][e], sl2, -((e & 1) ? L.y : L.x)));
            s[mt][n][e] = need_mask && key > qq ? 0.f : pr;
          }
        }
      }
      // dV += P^T dO.
      uint32_t pa[MT][4];
      mma_ab_acc<MT, BQ, D, SR>(dva, pa, c_frags(s), sdOs, off.bt, live);
      // dP^T = V dO^T.
      uint32_t va[MT][4];
      mma_abt<MT, BQ, D, SR>(dp, va, smem_frags<MT, SR>(sV, warp * WK, off.a, live), sdOs, off.bn,
                             live);
      // dS^T = P^T (dP^T - D).
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        if (!live[mt]) continue;
#pragma unroll
        for (int n = 0; n < BQ / 8; ++n) {
          const float2 Dv = *reinterpret_cast<const float2*>(sDs + n * 8 + tig * 2);
#pragma unroll
          for (int e = 0; e < 4; ++e)
            dp[mt][n][e] = s[mt][n][e] * (dp[mt][n][e] - ((e & 1) ? Dv.y : Dv.x));
        }
      }
      // dK += dS^T Q.
      uint32_t da[MT][4];
      mma_ab_acc<MT, BQ, D, SR>(dka, da, c_frags(dp), sQs, off.bt, live);
    }
    __syncthreads();  // this stage is refilled by the next iteration's prefetch
  }

  // dk (+)= scale dK, dv (+)= dV for this thread's keys.
  for_frag_rows<MT>(wk0, T_, [&](int mt, int r, int key, int col) {
    bf16* dkr = dk + kvoff + int64_t(key) * p.ldk + col;
    bf16* dvr = dv + kvoff + int64_t(key) * p.ldk + col;
#pragma unroll
    for (int n = 0; n < D / 8; ++n) {
      put_pair(dkr + n * 8, dka[mt][n][2 * r] * p.scale, dka[mt][n][2 * r + 1] * p.scale,
               p.accumulate);
      put_pair(dvr + n * 8, dva[mt][n][2 * r], dva[mt][n][2 * r + 1], p.accumulate);
    }
  });
}

template <int D, int NW, int MT, int BK>
constexpr size_t dq_mma_smem() {
  // sQ, sdO [BQ][SR]; double-buffered sK, sV [2][BK][SR]
  return sizeof(bf16) * (2 * NW * 16 * MT + 4 * BK) * smem_row<D>();
}

// Block: one query tile of one (batch, head): NW warps, each owning MT m-tiles
// of 16 query rows (BQ = NW * 16 * MT rows). Key tiles of BK keys.
template <int D, int NW, int MT, int BK>
__global__ void __launch_bounds__(NW * 32)
    dq_mma_kernel(Params p, int Tpad, bf16* __restrict__ dq, const bf16* __restrict__ q,
                  const bf16* __restrict__ k, const bf16* __restrict__ v,
                  const bf16* __restrict__ dout, const float* __restrict__ Dsc,
                  const float* __restrict__ Lsc) {
  constexpr int BQ = NW * 16 * MT, WR = 16 * MT, NT = NW * 32, SR = smem_row<D>();
  extern __shared__ __align__(16) unsigned char smem_raw[];
  bf16* sQ = reinterpret_cast<bf16*>(smem_raw);  // [BQ][SR]
  bf16* sdO = sQ + BQ * SR;                       // [BQ][SR]
  bf16* sK = sdO + BQ * SR;                       // [2][BK][SR]
  bf16* sV = sK + 2 * BK * SR;                    // [2][BK][SR]

  const int T_ = p.T;
  const auto [bh, b, h, j, q0] = query_tile<BQ>(p);
  const auto [warp, lane, g, tig] = frag_lane();
  const LdsmOffsets<SR> off(lane);

  // q: joint qkv rows (ldq); dout: its own [B*T, H hd] rows (ldo).
  const int64_t qoff = (int64_t(b) * T_ + q0) * p.ldq + int64_t(h) * D;
  const int64_t ooff = (int64_t(b) * T_ + q0) * p.ldo + int64_t(h) * D;
  const int nkt = visible_key_tiles<BQ, BK>(q0, T_);
  const auto issue = kv_tile_issuer<BK, D, NT>(sK, sV, k, v, p, b, j);

  load_tile_async<BQ, D, NT>(sQ, q + qoff, p.ldq, T_ - q0);
  load_tile_async<BQ, D, NT>(sdO, dout + ooff, p.ldo, T_ - q0);
  issue(0, 0);
  cp_async_commit();

  const float sl2 = p.scale * kLog2e;
  const int wq0 = q0 + warp * WR;  // m-tile mt: rows wq0 + 16 mt + g (+ 8)
  // Rows up to q0 + BQ <= Tpad exist in the scratch (padding: lse2 = +inf, D = 0).
  float Lr[MT][2], Dr[MT][2];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int64_t row = int64_t(bh) * Tpad + wq0 + mt * 16 + g + 8 * r;
      Lr[mt][r] = Lsc[row];
      Dr[mt][r] = Dsc[row];
    }
  float acc[MT][D / 8][4];
  zero_frags(acc);

  for (int it = 0; it < nkt; ++it) {
    const int st = it & 1;
    pipeline_wait(it, nkt, issue);

    const int k0 = it * BK;
    bool live[MT];
    if (live_row_tiles(live, k0, wq0, T_)) {
      const bf16* sKs = sK + st * BK * SR;
      const bf16* sVs = sV + st * BK * SR;
      float s[MT][BK / 8][4], dp[MT][BK / 8][4];
      zero_frags(s);
      zero_frags(dp);
      // S = Q K^T, dP = dO V^T (this warp's rows x BK keys).
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        uint32_t qa[MT][4], oa[MT][4];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          if (!live[mt]) continue;
          ldsm_x4(qa[mt], smem_u32(sQ + (warp * WR + mt * 16) * SR + off.a + kk * 16));
          ldsm_x4(oa[mt], smem_u32(sdO + (warp * WR + mt * 16) * SR + off.a + kk * 16));
        }
#pragma unroll
        for (int np = 0; np < BK / 16; ++np) {
          uint32_t kb[4], vb[4];
          ldsm_x4(kb, smem_u32(sKs + np * 16 * SR + off.bn + kk * 16));
          ldsm_x4(vb, smem_u32(sVs + np * 16 * SR + off.bn + kk * 16));
#pragma unroll
          for (int mt = 0; mt < MT; ++mt) {
            if (!live[mt]) continue;
            mma_bf16(s[mt][2 * np], qa[mt], kb[0], kb[1]);
            mma_bf16(s[mt][2 * np + 1], qa[mt], kb[2], kb[3]);
            mma_bf16(dp[mt][2 * np], oa[mt], vb[0], vb[1]);
            mma_bf16(dp[mt][2 * np + 1], oa[mt], vb[2], vb[3]);
          }
        }
      }
      // dS = P (dP - D), P = exp2(sl2 S - lse2), causal mask near the diagonal
      // (which also covers keys >= T for the rows that are written).
      uint32_t da[MT][BK / 16][4];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        if (!live[mt]) continue;
        const int row0 = wq0 + mt * 16 + g;
        const bool need_mask = k0 + BK - 1 > wq0 + mt * 16;
#pragma unroll
        for (int n = 0; n < BK / 8; ++n) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int key = k0 + n * 8 + tig * 2 + (e & 1), row = row0 + (e >> 1) * 8;
            float pr = fast_exp2(fmaf(s[mt][n][e], sl2, -Lr[mt][e >> 1]));
            if (need_mask && key > row) pr = 0.f;
            dp[mt][n][e] = pr * (dp[mt][n][e] - Dr[mt][e >> 1]);
          }
        }
#pragma unroll
        for (int kk = 0; kk < BK / 16; ++kk) c_to_a(da[mt][kk], dp[mt][2 * kk], dp[mt][2 * kk + 1]);
      }
      // dQ += dS K (B operand: the K tile [key][d] via .trans).
      uint32_t a[MT][4];
      mma_ab_acc<MT, BK, D, SR>(acc, a, reg_frags(da), sKs, off.bt, live);
    }
    __syncthreads();  // this stage is refilled by the next iteration's prefetch
  }

  // dq (+)= scale dQ for this thread's rows; dq has q's layout (column block
  // of dqkv): row stride ldq. (b and h are structured bindings, which a C++17
  // lambda cannot capture: their offsets are named here.)
  const int64_t batch_row0 = int64_t(b) * T_, head_col0 = int64_t(h) * D;
  for_frag_rows<MT>(wq0, T_, [&](int mt, int r, int row, int col) {
    bf16* dqr = dq + (batch_row0 + row) * p.ldq + head_col0 + col;
#pragma unroll
    for (int n = 0; n < D / 8; ++n)
      put_pair(dqr + n * 8, acc[mt][n][2 * r] * p.scale, acc[mt][n][2 * r + 1] * p.scale,
               p.accumulate);
  });
}

// Tile configurations: dK/dV kernel <NW, MT, BQ>, dQ kernel <NW, MT, BK>.
template <int D, int KV_NW, int KV_MT, int KV_BQ, int Q_NW, int Q_MT, int Q_BK>
void launch_bwd_mma(const Params& p, int Tpad, bf16* dq, bf16* dk, bf16* dv, const bf16* dout,
                    const bf16* q, const bf16* k, const bf16* v, const float* Dsc,
                    const float* Lsc) {
  constexpr int kBK = KV_NW * 16 * KV_MT, kBQ = Q_NW * 16 * Q_MT;
  static_assert(128 % KV_BQ == 0 && 128 % kBQ == 0, "query tiles must divide the lse padding");
  {
    constexpr size_t smem = dkdv_mma_smem<D, KV_NW, KV_MT, KV_BQ>();
    auto kernel = dkdv_mma_kernel<D, KV_NW, KV_MT, KV_BQ>;
    allow_smem(kernel, smem);
    const int64_t blocks = ceil_div(p.T, kBK) * p.B * p.Hkv;
    kernel<<<static_cast<unsigned>(blocks), KV_NW * 32, smem, stream()>>>(p, Tpad, dk, dv, q, k, v,
                                                                         dout, Dsc, Lsc);
    ATTNRES_CUDA_CHECK_LAUNCH();
  }
  {
    constexpr size_t smem = dq_mma_smem<D, Q_NW, Q_MT, Q_BK>();
    auto kernel = dq_mma_kernel<D, Q_NW, Q_MT, Q_BK>;
    allow_smem(kernel, smem);
    const int64_t blocks = ceil_div(p.T, kBQ) * p.B * p.H;
    kernel<<<static_cast<unsigned>(blocks), Q_NW * 32, smem, stream()>>>(p, Tpad, dq, q, k, v, dout,
                                                                        Dsc, Lsc);
    ATTNRES_CUDA_CHECK_LAUNCH();
  }
}

}  // namespace

template <typename T>
void backward_generic(const Params& p, T* dq, T* dk, T* dv, const T* dout, const T* q,
                      const T* k, const T* v, const T* out, const float* lse) {
  const Tensor scratch = preprocess<T>(p, dout, out, lse, 1.f);
  const int64_t rows = scratch.dim(1);
  const float* Dsc = static_cast<const float*>(scratch.raw());
  const float* Lsc = Dsc + rows;
  const int Tpad = static_cast<int>(padded_rows(p.T));
  if (p.hd <= 32) launch_bwd_generic<T, 32>(p, Tpad, dq, dk, dv, dout, q, k, v, Dsc, Lsc);
  else if (p.hd <= 64) launch_bwd_generic<T, 64>(p, Tpad, dq, dk, dv, dout, q, k, v, Dsc, Lsc);
  else if (p.hd <= 128) launch_bwd_generic<T, 128>(p, Tpad, dq, dk, dv, dout, q, k, v, Dsc, Lsc);
  else launch_bwd_generic<T, 256>(p, Tpad, dq, dk, dv, dout, q, k, v, Dsc, Lsc);
}
template void backward_generic<float>(const Params&, float*, float*, float*, const float*,
                                      const float*, const float*, const float*, const float*,
                                      const float*);
template void backward_generic<bf16>(const Params&, bf16*, bf16*, bf16*, const bf16*, const bf16*,
                                     const bf16*, const bf16*, const bf16*, const float*);

void backward_mma(const Params& p, bf16* dq, bf16* dk, bf16* dv, const bf16* dout, const bf16* q,
                  const bf16* k, const bf16* v, const bf16* out, const float* lse) {
  const Tensor scratch = preprocess<bf16>(p, dout, out, lse, kLog2e);
  const int64_t rows = scratch.dim(1);
  const float* Dsc = static_cast<const float*>(scratch.raw());
  const float* Lsc = Dsc + rows;
  const int Tpad = static_cast<int>(padded_rows(p.T));
  // hd <= 64: warps own 32 keys (dK/dV; 128-key blocks, 32-row query tiles)
  // or 32 query rows (dQ; 128-row blocks, 32-key tiles): every K/V or Q/dO
  // fragment read from shared memory feeds two m-tiles. hd = 128: the dK/dV
  // accumulators take 128 registers per 16 keys, so warps own 16 rows.
  switch (p.hd) {
    case 32: launch_bwd_mma<32, 4, 2, 32, 4, 2, 32>(p, Tpad, dq, dk, dv, dout, q, k, v, Dsc, Lsc); break;
    case 64: launch_bwd_mma<64, 4, 2, 32, 4, 2, 32>(p, Tpad, dq, dk, dv, dout, q, k, v, Dsc, Lsc); break;
    case 128: launch_bwd_mma<128, 4, 1, 32, 4, 1, 32>(p, Tpad, dq, dk, dv, dout, q, k, v, Dsc, Lsc); break;
    default: fail("attention backward: no tensor-core kernel for head dim ", p.hd);
  }
}

}  // namespace attnres::kernels::cuda::attn
