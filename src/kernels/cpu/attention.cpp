// CPU causal GQA attention.
//
// Both passes work on blocks of kQBlock query rows of one head at a time:
// the block's scores against every key it may see form a [rows, keys] matrix
// small enough to live in per-thread scratch (kQBlock * T values), so the
// score/probability matrices are produced with BLAS and never stored whole
// (B*H*T*T would not fit for long sequences). The backward pass recomputes the
// probabilities from q, k and the saved log-sum-exp, as flash attention does.
//
// Each work item is computed by one thread with single-threaded BLAS calls
// (gemm_serial, blas.h) in a fixed order, so the result bits do not depend on
// the thread count.
#include "kernels/cpu/attention.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/blas.h"

namespace attnres::kernels::cpu {

namespace {

// Query rows per block. 64 keeps the per-thread scratch at 64*T values per
// buffer and gives BLAS GEMMs large enough (64 x keys x hd) to run near peak.
constexpr int64_t kQBlock = 64;

// Where one (batch, head) slice starts: q, k and v are the column blocks of
// the joint qkv rows (kernels/attention.h), so they share its row stride;
// out (and dout) are rows of their own. Values (and out) have dv columns a
// head, queries and keys hd.
struct Heads {
  int64_t Tlen, H, Hkv, hd, dv;
  int64_t ldqkv() const { return (H + Hkv) * hd + Hkv * dv; }  // row stride of q / k / v (and grads)
  int64_t ldo() const { return H * dv; }                       // row stride of out / dout
  int64_t row(int64_t b, int64_t t) const { return b * Tlen + t; }
  int64_t q_off(int64_t b, int64_t t, int64_t h) const { return row(b, t) * ldqkv() + h * hd; }
  int64_t k_off(int64_t b, int64_t t, int64_t j) const {
    return row(b, t) * ldqkv() + (H + j) * hd;
  }
  int64_t v_off(int64_t b, int64_t t, int64_t j) const {
    return row(b, t) * ldqkv() + (H + Hkv) * hd + j * dv;
  }
  int64_t o_off(int64_t b, int64_t t, int64_t h) const { return row(b, t) * ldo() + h * dv; }
};

}  // namespace

template <typename T>
void attention_forward(T* out, T* lse, const T* qkv, int64_t B, int64_t Tlen, int64_t H,
                       int64_t Hkv, int64_t hd, int64_t dv) {
  const Heads L{Tlen, H, Hkv, hd, dv};
  const int64_t group = H / Hkv;  // query heads per KV head
  const int64_t n_qblocks = (Tlen + kQBlock - 1) / kQBlock;
  const T scale = T(1) / std::sqrt(T(hd));

#pragma omp parallel
  {
    std::vector<T> scores(static_cast<size_t>(kQBlock * Tlen));  // [rows, keys] of one block
    // Later query blocks see more keys (causal), so hand items out dynamically.
    // Which thread runs an item does not change how the item is computed.
#pragma omp for collapse(3) schedule(dynamic, 1)
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t qb = 0; qb < n_qblocks; ++qb) {
          const int64_t t0 = qb * kQBlock;
          const int64_t rows = std::min(kQBlock, Tlen - t0);
          const int64_t keys = t0 + rows;  // the block's last row sees keys [0, t0+rows)
          const int64_t j = h / group;
          T* S = scores.data();

          // S = scale * Q_blk K^T over keys [0, keys).
          gemm_serial(false, true, rows, keys, hd, scale, qkv + L.q_off(b, t0, h), L.ldqkv(),
                      qkv + L.k_off(b, 0, j), L.ldqkv(), T(0), S, keys);

          // Row t = t0 + i sees keys [0, t]. Softmax with max subtraction;
          // masked keys get probability exactly 0 so the PV product ignores them.
          for (int64_t i = 0; i < rows; ++i) {
            T* s = S + i * keys;
            const int64_t n_valid = t0 + i + 1;
            T m = s[0];
            for (int64_t c = 1; c < n_valid; ++c) m = std::max(m, s[c]);
            T l = 0;
            for (int64_t c = 0; c < n_valid; ++c) {
              s[c] = std::exp(s[c] - m);
              l += s[c];
            }
            const T inv = T(1) / l;
#pragma omp simd
            for (int64_t c = 0; c < n_valid; ++c) s[c] *= inv;
            for (int64_t c = n_valid; c < keys; ++c) s[c] = T(0);
            lse[(b * H + h) * Tlen + t0 + i] = m + std::log(l);
          }

          // out_blk = P V over keys [0, keys), written straight into the head's columns.
          gemm_serial(false, false, rows, dv, keys, T(1), S, keys, qkv + L.v_off(b, 0, j),
                      L.ldqkv(), T(0), out + L.o_off(b, t0, h), L.ldo());
        }
  }
}

// With P = softmax(S), S = scale q k^T, O = P V:
//   dV = P^T dO,  dP = dO V^T,  dS = P * (dP - D) with D_i = sum_c dP_ic P_ic = dO_i . O_i,
//   dQ = scale dS K,  dK = scale dS^T Q.
// One work item is one (batch, KV head): it owns dk/dv of that KV head, which
// all query heads of its group write, so no two threads ever touch the same
// gradient element and no atomics or reductions across threads are needed.
template <typename T>
void attention_backward(T* dqkv, const T* dout, const T* qkv, const T* out, const T* lse,
                        int64_t B, int64_t Tlen, int64_t H, int64_t Hkv, int64_t hd,
                        int64_t dv, bool accumulate) {
  const Heads L{Tlen, H, Hkv, hd, dv};
  const int64_t group = H / Hkv;
  const int64_t n_qblocks = (Tlen + kQBlock - 1) / kQBlock;
  const T scale = T(1) / std::sqrt(T(hd));

#pragma omp parallel
  {
    std::vector<T> pbuf(static_cast<size_t>(kQBlock * Tlen));   // P of one block
    std::vector<T> dsbuf(static_cast<size_t>(kQBlock * Tlen));  // dP, then dS in place
    std::vector<T> D(static_cast<size_t>(kQBlock));
#pragma omp for collapse(2) schedule(dynamic, 1)
    for (int64_t b = 0; b < B; ++b)
      for (int64_t j = 0; j < Hkv; ++j) {
        const int64_t ld = L.ldqkv();
        const T* kb = qkv + L.k_off(b, 0, j);
        const T* vb = qkv + L.v_off(b, 0, j);
        T* dkb = dqkv + L.k_off(b, 0, j);
        T* dvb = dqkv + L.v_off(b, 0, j);
        if (!accumulate)  // dk/dv sum over the group's heads and query blocks below
          for (int64_t t = 0; t < Tlen; ++t) {
            std::fill_n(dkb + t * ld, hd, T(0));
            std::fill_n(dvb + t * ld, dv, T(0));
          }
        for (int64_t h = j * group; h < (j + 1) * group; ++h)
          for (int64_t qb = 0; qb < n_qblocks; ++qb) {
            const int64_t t0 = qb * kQBlock;
            const int64_t rows = std::min(kQBlock, Tlen - t0);
            const int64_t keys = t0 + rows;
            const T* qblk = qkv + L.q_off(b, t0, h);
            const T* doblk = dout + L.o_off(b, t0, h);
            const T* oblk = out + L.o_off(b, t0, h);
            const T* lse_blk = lse + (b * H + h) * Tlen + t0;
            T* P = pbuf.data();
            T* dS = dsbuf.data();

            // Recompute P = exp(scale q k^T - lse), zero above the diagonal.
            gemm_serial(false, true, rows, keys, hd, scale, qblk, ld, kb, ld, T(0), P, keys);
            for (int64_t i = 0; i < rows; ++i) {
              T* p = P + i * keys;
              const int64_t n_valid = t0 + i + 1;
              const T m = lse_blk[i];
              for (int64_t c = 0; c < n_valid; ++c) p[c] = std::exp(p[c] - m);
              for (int64_t c = n_valid; c < keys; ++c) p[c] = T(0);
            }

            // dP = dO V^T; D_i = dO_i . O_i; dS = P * (dP - D) in place.
            gemm_serial(false, true, rows, keys, dv, T(1), doblk, L.ldo(), vb, ld, T(0), dS, keys);
            for (int64_t i = 0; i < rows; ++i) {
              const T* doi = doblk + i * L.ldo();
              const T* oi = oblk + i * L.ldo();
              T s = 0;
#pragma omp simd reduction(+ : s)
              for (int64_t c = 0; c < dv; ++c) s += doi[c] * oi[c];
              D[i] = s;
            }
            for (int64_t i = 0; i < rows; ++i) {
              const T* p = P + i * keys;
              T* ds = dS + i * keys;
              const T Di = D[i];
#pragma omp simd
              for (int64_t c = 0; c < keys; ++c) ds[c] = p[c] * (ds[c] - Di);
            }

            // Into the gradients: dQ rows of this block get their whole sum
            // here (beta = 0 unless accumulating), dK/dV add up (beta = 1).
            // dQ += scale dS K; dK += scale dS^T Q; dV += P^T dO.
            gemm_serial(false, false, rows, hd, keys, scale, dS, keys, kb, ld, T(accumulate),
                        dqkv + L.q_off(b, t0, h), ld);
            gemm_serial(true, false, keys, hd, rows, scale, dS, keys, qblk, ld, T(1), dkb, ld);
            gemm_serial(true, false, keys, dv, rows, T(1), P, keys, doblk, L.ldo(), T(1), dvb, ld);
          }
      }
  }
}

// Decoding is one query row per (sequence, head): a matrix-vector product
// each way, done with plain loops (per row there is too little work for BLAS).
template <typename T>
void attention_decode(T* out, const T* q, const T* k_cache, const T* v_cache, int64_t B,
                      int64_t Tmax, int64_t len, int64_t H, int64_t Hkv, int64_t hd, int64_t dv) {
  const int64_t group = H / Hkv, ldq = H * hd, ldk = Hkv * hd, ldv = Hkv * dv, ldo = H * dv;
  const T scale = T(1) / std::sqrt(T(hd));
  // No BLAS inside, so running serially for small problems cannot change the result.
#pragma omp parallel if (B * H * len * hd >= (1 << 16))
  {
    std::vector<T> p(static_cast<size_t>(len));
#pragma omp for collapse(2) schedule(static)
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < H; ++h) {
        const T* qh = q + b * ldq + h * hd;
        const T* kb = k_cache + b * Tmax * ldk + (h / group) * hd;
        const T* vb = v_cache + b * Tmax * ldv + (h / group) * dv;
        T* oh = out + b * ldo + h * dv;
        T m = -INFINITY;
        for (int64_t t = 0; t < len; ++t) {
          const T* kt = kb + t * ldk;
          T s = 0;
#pragma omp simd reduction(+ : s)
          for (int64_t c = 0; c < hd; ++c) s += qh[c] * kt[c];
          p[t] = s * scale;
          m = std::max(m, p[t]);
        }
        T l = 0;
        for (int64_t t = 0; t < len; ++t) {
          p[t] = std::exp(p[t] - m);
          l += p[t];
        }
        const T inv = T(1) / l;
        for (int64_t c = 0; c < dv; ++c) oh[c] = T(0);
        for (int64_t t = 0; t < len; ++t) {
          const T pt = p[t] * inv;
          const T* vt = vb + t * ldv;
#pragma omp simd
          for (int64_t c = 0; c < dv; ++c) oh[c] += pt * vt[c];
        }
      }
  }
}

template void attention_forward<float>(float*, float*, const float*, int64_t, int64_t, int64_t,
                                       int64_t, int64_t, int64_t);
template void attention_forward<double>(double*, double*, const double*, int64_t, int64_t, int64_t,
                                        int64_t, int64_t, int64_t);
template void attention_backward<float>(float*, const float*, const float*, const float*,
                                        const float*, int64_t, int64_t, int64_t, int64_t, int64_t,
                                        int64_t, bool);
template void attention_backward<double>(double*, const double*, const double*, const double*,
                                         const double*, int64_t, int64_t, int64_t, int64_t,
                                         int64_t, int64_t, bool);
template void attention_decode<float>(float*, const float*, const float*, const float*, int64_t,
                                      int64_t, int64_t, int64_t, int64_t, int64_t, int64_t);
template void attention_decode<double>(double*, const double*, const double*, const double*,
                                       int64_t, int64_t, int64_t, int64_t, int64_t, int64_t,
                                       int64_t);

}  // namespace attnres::kernels::cpu
