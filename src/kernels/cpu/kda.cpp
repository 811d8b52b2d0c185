// CPU KDA core: the chunkwise forward and backward of kernels/kda.h, and the
// token-by-token recurrence.
//
// Each (sequence, head) is independent: the OpenMP team takes them in a fixed
// order and each runs its chunks one after another with single-threaded
// GEMMs (cpu::gemm_serial), so the bits do not depend on the thread count.
// Inside a chunk (n <= C rows) everything is in contiguous work buffers:
// q, k, v, beta of its rows and Gamma, the cumulative log-decay.
//
// The backward (derivation in docs/model.md "KDA layer") takes the adjoints
// of the forward's chunk steps in reverse order:
//   S_C = Diag(eL) S_0 + Ke^T U         eL = exp(Gamma_C), Ke = exp(Gamma_C - Gamma) . K
//   O   = scale (Qb S_0 + P U)          Qb = exp(Gamma) . Q
//   M U = X, M = I + Diag(beta) A       X = beta . (V - Kb S_0), Kb = exp(Gamma) . K
//   A, P from K, Q and Gamma (the pairs' exponentials, as the forward makes them)
//   Gamma = cumsum(g)
// with dS_0 handed to the chunk before. Nothing but the inputs is saved: the
// chunks' start states are recomputed by a forward pass over the head's
// chunks first (one head's states at a time, in the thread's work buffer).
#include "kernels/cpu/kda.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/blas.h"

namespace attnres::kernels::cpu {

namespace {

constexpr int64_t kSub = 16;  // the sub-chunk: pairs inside one take their exps one by one

template <typename T>
using Buf = std::vector<T>;

// One head's chunk and the products of its forward, reused chunk to chunk.
template <typename T>
struct Chunk {
  int64_t C, K, V, n = 0;
  Buf<T> q, k, v, beta;           // n rows of K (q, k), V (v), 1 (beta)
  Buf<T> dec;                     // exp(g): each token's decay, the only exps taken
  Buf<T> eG, eE;                  // exp(Gamma_i), exp(Gamma_last - Gamma_i): products of decays
  Buf<T> A, P;                    // [C, C]: rows i < n, columns j <= i
  Buf<T> Kb, Qb, Ke, eL;          // eG . K, eG . Q, eE . K; exp(Gamma_last)
  Buf<T> R, U;                    // V - Kb S_0; the WY pseudo-values
  Buf<T> eIR, eRJ;                // a sub-chunk's exp(Gamma_i - Gamma_r), exp(Gamma_r - Gamma_j)
  Buf<T> s1, s2, s3;              // scaled rows for the sub-chunk GEMMs

  Chunk(int64_t C_, int64_t K_, int64_t V_) : C(C_), K(K_), V(V_) {
    for (Buf<T>* b : {&q, &k, &dec, &eG, &eE, &Kb, &Qb, &Ke, &eIR, &eRJ, &s1, &s2, &s3})
      b->resize(size_t(C * K));
    for (Buf<T>* b : {&v, &R, &U}) b->resize(size_t(C * V));
    beta.resize(size_t(C));
    A.resize(size_t(C * C));
    P.resize(size_t(C * C));
    eL.resize(size_t(K));
  }

  // Rows [t0, t0 + n) of sequence b, head h.
  void load(const KdaArgs<T>& a, int64_t b, int64_t h, int64_t t0, int64_t n_) {
    n = n_;
    const int64_t HK = a.H * K, HV = a.H * V;
    for (int64_t i = 0; i < n; ++i) {
      const int64_t row = b * a.T_ + t0 + i;
      const T* qr = a.q + row * HK + h * K;
      const T* kr = a.k + row * HK + h * K;
      const T* gr = a.g + row * HK + h * K;
      std::copy(qr, qr + K, &q[size_t(i * K)]);
      std::copy(kr, kr + K, &k[size_t(i * K)]);
      const T* vr = a.v + row * HV + h * V;
      std::copy(vr, vr + V, &v[size_t(i * V)]);
      beta[size_t(i)] = a.beta[row * a.H + h];
      for (int64_t c = 0; c < K; ++c) dec[size_t(i * K + c)] = std::exp(gr[c]);
    }
  }

  // exp(Gamma_i - Gamma_j) for j <= i is the product of the decays of rows
  // j + 1 .. i, each <= 1: no exp of a (possibly huge) difference is taken,
  // and a product that underflows is one whose true value is below fp32's
  // range. Chains are at most C long (rounding grows as their length).
  //
  // The sub-chunk [I0, I1)'s factors through r = I0 - 1: eIR rows i - I0,
  // eRJ rows j < I0.
  void sub_factors(int64_t I0, int64_t I1) {
    // Row by row (the channels vectorise).
    for (int64_t i = I0; i < I1; ++i)
      for (int64_t c = 0; c < K; ++c)
        eIR[size_t((i - I0) * K + c)] =
            (i > I0 ? eIR[size_t((i - I0 - 1) * K + c)] : T(1)) * dec[size_t(i * K + c)];
    for (int64_t j = I0 - 1; j >= 0; --j)
      for (int64_t c = 0; c < K; ++c)
        eRJ[size_t(j * K + c)] = j == I0 - 1 ? T(1) : eRJ[size_t((j + 1) * K + c)] * dec[size_t((j + 1) * K + c)];
  }

  // f(i, j, e) for the pairs j <= i of the sub-chunk [I0, I1), e[c] =
  // exp(Gamma_ic - Gamma_jc) (j from i down, one product a step).
  template <typename F>
  void diagonal_pairs(int64_t I0, int64_t I1, Buf<T>& e, F f) const {
    for (int64_t i = I0; i < I1; ++i) {
      std::fill(e.begin(), e.begin() + K, T(1));
      for (int64_t j = i; j >= I0; --j) {
        f(i, j, e.data());
        for (int64_t c = 0; c < K; ++c) e[size_t(c)] *= dec[size_t(j * K + c)];
      }
    }
  }

  // A and P (rows < n; P only `with_p`: the states alone need A), and eG,
  // eE, Kb, Qb, Ke, eL.
  void decay_products(bool with_p = true) {
    const int64_t last = n - 1;
    for (int64_t i = 0; i < n; ++i)
      for (int64_t c = 0; c < K; ++c)
        eG[size_t(i * K + c)] = (i > 0 ? eG[size_t((i - 1) * K + c)] : T(1)) * dec[size_t(i * K + c)];
    for (int64_t i = last; i >= 0; --i)
      for (int64_t c = 0; c < K; ++c)
        eE[size_t(i * K + c)] = i == last ? T(1) : eE[size_t((i + 1) * K + c)] * dec[size_t((i + 1) * K + c)];
    std::copy(&eG[size_t(last * K)], &eG[size_t(last * K)] + K, eL.begin());
    for (int64_t x = 0; x < n * K; ++x) {
      Kb[size_t(x)] = eG[size_t(x)] * k[size_t(x)];
      Qb[size_t(x)] = eG[size_t(x)] * q[size_t(x)];
      Ke[size_t(x)] = eE[size_t(x)] * k[size_t(x)];
    }
    std::fill(A.begin(), A.end(), T(0));
    std::fill(P.begin(), P.end(), T(0));
    for (int64_t I0 = 0; I0 < n; I0 += kSub) {
      const int64_t I1 = std::min(I0 + kSub, n), m = I1 - I0;
      diagonal_pairs(I0, I1, s1, [&](int64_t i, int64_t j, const T* e) {
        T sa = 0, sp = 0;
        for (int64_t c = 0; c < K; ++c) {
          const T kj = k[size_t(j * K + c)] * e[c];
          sa += k[size_t(i * K + c)] * kj;
          sp += q[size_t(i * K + c)] * kj;
        }
        if (j < i) A[size_t(i * C + j)] = sa;
        if (with_p) P[size_t(i * C + j)] = sp;
      });
      if (I0 == 0) continue;
      // Rows j < I0 against rows i of the sub-chunk, through r = I0 - 1.
      sub_factors(I0, I1);
      for (int64_t x = 0; x < I0 * K; ++x) s1[size_t(x)] = k[size_t(x)] * eRJ[size_t(x)];
      for (int64_t x = 0; x < m * K; ++x) {
        s2[size_t(x)] = k[size_t(I0 * K + x)] * eIR[size_t(x)];
        s3[size_t(x)] = q[size_t(I0 * K + x)] * eIR[size_t(x)];
      }
      gemm_serial<T>(false, true, m, I0, K, T(1), s2.data(), K, s1.data(), K, T(0), &A[size_t(I0 * C)], C);
      if (with_p)
        gemm_serial<T>(false, true, m, I0, K, T(1), s3.data(), K, s1.data(), K, T(0), &P[size_t(I0 * C)], C);
    }
  }

  // R = V - Kb S_0 and U: (I + Diag(beta) A) U = Diag(beta) R, by forward substitution.
  void solve(const T* S) {
    std::copy(v.begin(), v.begin() + n * V, R.begin());
    gemm_serial<T>(false, false, n, V, K, T(-1), Kb.data(), K, S, V, T(1), R.data(), V);
    for (int64_t i = 0; i < n; ++i) {
      T* ui = &U[size_t(i * V)];
      const T bi = beta[size_t(i)];
      for (int64_t e = 0; e < V; ++e) ui[e] = bi * R[size_t(i * V + e)];
      for (int64_t j = 0; j < i; ++j) {
        const T w = bi * A[size_t(i * C + j)];
        const T* uj = &U[size_t(j * V)];
        for (int64_t e = 0; e < V; ++e) ui[e] -= w * uj[e];
      }
    }
  }

  // S_0 -> S_C in place: Diag(eL) S_0 + Ke^T U.
  void advance(T* S) const {
    for (int64_t c = 0; c < K; ++c)
      for (int64_t e = 0; e < V; ++e) S[c * V + e] *= eL[size_t(c)];
    gemm_serial<T>(true, false, K, V, n, T(1), Ke.data(), K, U.data(), V, T(1), S, V);
  }
};

// The (b, h) pairs, one per OpenMP iteration in a fixed order. Each thread
// makes its work buffers once (make()) and hands them to every pair it runs:
// at small heads (K = 32, T = 128) allocating them per pair cost as much as
// the pair's arithmetic.
template <typename Make, typename F>
void for_heads(int64_t B, int64_t H, Make make, F f) {
  const int64_t n = B * H;
#pragma omp parallel
  {
    auto work = make();
#pragma omp for schedule(static)
    for (int64_t x = 0; x < n; ++x) f(work, x / H, x % H);
  }
}

}  // namespace

template <typename T>
void kda_forward(T* o, const KdaArgs<T>& a) {
  const int64_t K = a.K, V = a.V, C = a.chunk, HV = a.H * V;
  struct Work {
    Chunk<T> ch;
    Buf<T> S, O;
  };
  const auto make = [&] { return Work{Chunk<T>(C, K, V), Buf<T>(size_t(K * V)), Buf<T>(size_t(C * V))}; };
  for_heads(a.B, a.H, make, [&](Work& w, int64_t b, int64_t h) {
    Chunk<T>& ch = w.ch;
    Buf<T>&S = w.S, &O = w.O;
    std::fill(S.begin(), S.end(), T(0));
    for (int64_t t0 = 0; t0 < a.T_; t0 += C) {
      const int64_t n = std::min(C, a.T_ - t0);
      ch.load(a, b, h, t0, n);
      ch.decay_products();
      ch.solve(S.data());
      // O = scale (Qb S_0 + P U), before the state moves on.
      gemm_serial<T>(false, false, n, V, K, T(1), ch.Qb.data(), K, S.data(), V, T(0), O.data(), V);
      gemm_serial<T>(false, false, n, V, n, T(1), ch.P.data(), C, ch.U.data(), V, T(1), O.data(), V);
      for (int64_t i = 0; i < n; ++i) {
        T* orow = o + (b * a.T_ + t0 + i) * HV + h * V;
        for (int64_t e = 0; e < V; ++e) orow[e] = a.scale * O[size_t(i * V + e)];
      }
      ch.advance(S.data());
    }
  });
}

template <typename T>
void kda_backward(T* dq, T* dk, T* dv, T* dg, T* dbeta, const T* dout, const KdaArgs<T>& a,
                  bool accumulate) {
  const int64_t K = a.K, V = a.V, C = a.chunk, HK = a.H * K, HV = a.H * V;
  const int64_t chunks = (a.T_ + C - 1) / C;
  // Every buffer but the first start state and dS is written before it is
  // read, chunk by chunk.
  struct Work {
    Chunk<T> ch;
    Buf<T> starts, dS, dS0;
    Buf<T> Ob, Ub, Xb, Vb;              // [C, V]
    Buf<T> Keb, Qbb, Kbb, Kg, Qg, Gg;   // [C, K]
    Buf<T> ZA, YA, ZP, YP, t1, t2;      // [C, K]
    Buf<T> Mb, Ab, Pb, betab;           // [C, C]; [C]
  };
  const auto make = [&] {
    const size_t CK = size_t(C * K), CV = size_t(C * V), CC = size_t(C * C), KV = size_t(K * V);
    return Work{Chunk<T>(C, K, V), Buf<T>(size_t(chunks) * KV), Buf<T>(KV), Buf<T>(KV),
                Buf<T>(CV), Buf<T>(CV), Buf<T>(CV), Buf<T>(CV),
                Buf<T>(CK), Buf<T>(CK), Buf<T>(CK), Buf<T>(CK), Buf<T>(CK), Buf<T>(CK),
                Buf<T>(CK), Buf<T>(CK), Buf<T>(CK), Buf<T>(CK), Buf<T>(CK), Buf<T>(CK),
                Buf<T>(CC), Buf<T>(CC), Buf<T>(CC), Buf<T>(size_t(C))};
  };
  for_heads(a.B, a.H, make, [&](Work& w, int64_t b, int64_t h) {
    Chunk<T>& ch = w.ch;
    Buf<T>&starts = w.starts, &dS = w.dS, &dS0 = w.dS0;
    Buf<T>&Ob = w.Ob, &Ub = w.Ub, &Xb = w.Xb, &Vb = w.Vb;
    Buf<T>&Keb = w.Keb, &Qbb = w.Qbb, &Kbb = w.Kbb, &Kg = w.Kg, &Qg = w.Qg, &Gg = w.Gg;
    Buf<T>&ZA = w.ZA, &YA = w.YA, &ZP = w.ZP, &YP = w.YP, &t1 = w.t1, &t2 = w.t2;
    Buf<T>&Mb = w.Mb, &Ab = w.Ab, &Pb = w.Pb, &betab = w.betab;
    // The chunks' start states, recomputed.
    std::fill(starts.begin(), starts.begin() + K * V, T(0));
    for (int64_t c = 0; c + 1 < chunks; ++c) {
      const int64_t t0 = c * C, n = std::min(C, a.T_ - t0);
      T* S = &starts[size_t((c + 1) * K * V)];
      std::copy(S - K * V, S, S);
      ch.load(a, b, h, t0, n);
      ch.decay_products(/*with_p=*/false);
      ch.solve(S);
      ch.advance(S);
    }
    std::fill(dS.begin(), dS.end(), T(0));
    for (int64_t c = chunks - 1; c >= 0; --c) {
      const int64_t t0 = c * C, n = std::min(C, a.T_ - t0), last = n - 1;
      const T* S0 = &starts[size_t(c * K * V)];
      ch.load(a, b, h, t0, n);
      ch.decay_products();
      ch.solve(S0);
      std::fill(Gg.begin(), Gg.end(), T(0));
      std::fill(betab.begin(), betab.end(), T(0));
      // (a) S_C = Diag(eL) S_0 + Ke^T U.
      for (int64_t x = 0; x < K; ++x) {
        T s = 0;
        for (int64_t e = 0; e < V; ++e) {
          dS0[size_t(x * V + e)] = ch.eL[size_t(x)] * dS[size_t(x * V + e)];
          s += S0[x * V + e] * dS[size_t(x * V + e)];
        }
        Gg[size_t(last * K + x)] += ch.eL[size_t(x)] * s;
      }
      gemm_serial<T>(false, true, n, K, V, T(1), ch.U.data(), V, dS.data(), V, T(0), Keb.data(), K);
      gemm_serial<T>(false, false, n, V, K, T(1), ch.Ke.data(), K, dS.data(), V, T(0), Ub.data(), V);
      // (b) O = scale (Qb S_0 + P U).
      for (int64_t i = 0; i < n; ++i) {
        const T* drow = dout + (b * a.T_ + t0 + i) * HV + h * V;
        for (int64_t e = 0; e < V; ++e) Ob[size_t(i * V + e)] = a.scale * drow[e];
      }
      gemm_serial<T>(false, true, n, K, V, T(1), Ob.data(), V, S0, V, T(0), Qbb.data(), K);
      gemm_serial<T>(true, false, K, V, n, T(1), ch.Qb.data(), K, Ob.data(), V, T(1), dS0.data(), V);
      gemm_serial<T>(false, true, n, n, V, T(1), Ob.data(), V, ch.U.data(), V, T(0), Pb.data(), C);
      for (int64_t i = 0; i < n; ++i)
        for (int64_t j = i + 1; j < n; ++j) Pb[size_t(i * C + j)] = 0;  // P is lower triangular
      gemm_serial<T>(true, false, n, V, n, T(1), ch.P.data(), C, Ob.data(), V, T(1), Ub.data(), V);
      // (c) M U = X: M^T Xb = Ub by back substitution (M_ji = beta_j A_ji, j > i).
      for (int64_t i = n - 1; i >= 0; --i) {
        T* xi = &Xb[size_t(i * V)];
        std::copy(&Ub[size_t(i * V)], &Ub[size_t(i * V)] + V, xi);
        for (int64_t j = i + 1; j < n; ++j) {
          const T w = ch.beta[size_t(j)] * ch.A[size_t(j * C + i)];
          const T* xj = &Xb[size_t(j * V)];
          for (int64_t e = 0; e < V; ++e) xi[e] -= w * xj[e];
        }
      }
      // Mb = -Xb U^T (its strictly lower part is all M has).
      gemm_serial<T>(false, true, n, n, V, T(-1), Xb.data(), V, ch.U.data(), V, T(0), Mb.data(), C);
      std::fill(Ab.begin(), Ab.end(), T(0));
      for (int64_t i = 0; i < n; ++i) {
        T s = 0;
        for (int64_t j = 0; j < i; ++j) {
          s += Mb[size_t(i * C + j)] * ch.A[size_t(i * C + j)];
          Ab[size_t(i * C + j)] = ch.beta[size_t(i)] * Mb[size_t(i * C + j)];
        }
        T r = 0;
        for (int64_t e = 0; e < V; ++e) r += Xb[size_t(i * V + e)] * ch.R[size_t(i * V + e)];
        betab[size_t(i)] = s + r;
        // Rb = beta Xb is dL/dV (R = V - Kb S_0), kept in Vb.
        for (int64_t e = 0; e < V; ++e) Vb[size_t(i * V + e)] = ch.beta[size_t(i)] * Xb[size_t(i * V + e)];
      }
      gemm_serial<T>(false, true, n, K, V, T(-1), Vb.data(), V, S0, V, T(0), Kbb.data(), K);
      gemm_serial<T>(true, false, K, V, n, T(-1), ch.Kb.data(), K, Vb.data(), V, T(1), dS0.data(), V);
      // (d) A and P: ZA_i = sum_j Ab_ij k_j E_ij, YA_j = sum_i Ab_ij k_i E_ij, ZP_i =
      // sum_j Pb_ij k_j E_ij, YP_j = sum_i Pb_ij q_i E_ij (E_ij = exp(Gamma_i - Gamma_j)),
      // the pairs inside a sub-chunk one by one, across through r as the forward.
      for (Buf<T>* z : {&ZA, &YA, &ZP, &YP}) std::fill(z->begin(), z->end(), T(0));
      for (int64_t I0 = 0; I0 < n; I0 += kSub) {
        const int64_t I1 = std::min(I0 + kSub, n), m = I1 - I0;
        ch.diagonal_pairs(I0, I1, t1, [&](int64_t i, int64_t j, const T* e) {
          const T wa = j < i ? Ab[size_t(i * C + j)] : T(0), wp = Pb[size_t(i * C + j)];
          for (int64_t x = 0; x < K; ++x) {
            const T ki = ch.k[size_t(i * K + x)], kj = ch.k[size_t(j * K + x)];
            ZA[size_t(i * K + x)] += wa * kj * e[x];
            YA[size_t(j * K + x)] += wa * ki * e[x];
            ZP[size_t(i * K + x)] += wp * kj * e[x];
            YP[size_t(j * K + x)] += wp * ch.q[size_t(i * K + x)] * e[x];
          }
        });
        if (I0 == 0) continue;
        ch.sub_factors(I0, I1);
        const Buf<T>&eIR = ch.eIR, &eRJ = ch.eRJ;
        for (int64_t x = 0; x < I0 * K; ++x) ch.s1[size_t(x)] = ch.k[size_t(x)] * eRJ[size_t(x)];
        for (int64_t x = 0; x < m * K; ++x) {
          ch.s2[size_t(x)] = ch.k[size_t(I0 * K + x)] * eIR[size_t(x)];
          ch.s3[size_t(x)] = ch.q[size_t(I0 * K + x)] * eIR[size_t(x)];
        }
        const T* Ablk = &Ab[size_t(I0 * C)];
        const T* Pblk = &Pb[size_t(I0 * C)];
        auto add_scaled = [&](Buf<T>& dst, int64_t row0, int64_t rows, const Buf<T>& prod,
                              const Buf<T>& scale) {
          for (int64_t i = 0; i < rows; ++i)
            for (int64_t x = 0; x < K; ++x)
              dst[size_t((row0 + i) * K + x)] += prod[size_t(i * K + x)] * scale[size_t(i * K + x)];
        };
        gemm_serial<T>(false, false, m, K, I0, T(1), Ablk, C, ch.s1.data(), K, T(0), t1.data(), K);
        add_scaled(ZA, I0, m, t1, eIR);
        gemm_serial<T>(false, false, m, K, I0, T(1), Pblk, C, ch.s1.data(), K, T(0), t1.data(), K);
        add_scaled(ZP, I0, m, t1, eIR);
        gemm_serial<T>(true, false, I0, K, m, T(1), Ablk, C, ch.s2.data(), K, T(0), t2.data(), K);
        add_scaled(YA, 0, I0, t2, eRJ);
        gemm_serial<T>(true, false, I0, K, m, T(1), Pblk, C, ch.s3.data(), K, T(0), t2.data(), K);
        add_scaled(YP, 0, I0, t2, eRJ);
      }
      // (e) Kb, Qb, Ke and the pairs' terms into dK, dQ and dGamma.
      for (int64_t i = 0; i < n; ++i)
        for (int64_t x = 0; x < K; ++x) {
          const size_t p = size_t(i * K + x);
          const T eg = ch.eG[p], ee = ch.eE[p];
          const T kv = ch.k[p], qv = ch.q[p];
          const T te = ee * kv * Keb[p];
          Kg[p] = eg * Kbb[p] + ee * Keb[p] + ZA[p] + YA[p] + YP[p];
          Qg[p] = eg * Qbb[p] + ZP[p];
          Gg[p] += eg * kv * Kbb[p] + eg * qv * Qbb[p] - te + kv * ZA[p] + qv * ZP[p] -
                   kv * YA[p] - kv * YP[p];
          Gg[size_t(last * K + x)] += te;
        }
      // (f) Gamma = cumsum(g): dg is dGamma's reverse cumulative sum. Written out.
      for (int64_t i = n - 2; i >= 0; --i)
        for (int64_t x = 0; x < K; ++x) Gg[size_t(i * K + x)] += Gg[size_t((i + 1) * K + x)];
      for (int64_t i = 0; i < n; ++i) {
        const int64_t row = b * a.T_ + t0 + i;
        T* dqr = dq + row * HK + h * K;
        T* dkr = dk + row * HK + h * K;
        T* dgr = dg + row * HK + h * K;
        T* dvr = dv + row * HV + h * V;
        for (int64_t x = 0; x < K; ++x) {
          const size_t p = size_t(i * K + x);
          dqr[x] = (accumulate ? dqr[x] : T(0)) + Qg[p];
          dkr[x] = (accumulate ? dkr[x] : T(0)) + Kg[p];
          dgr[x] = (accumulate ? dgr[x] : T(0)) + Gg[p];
        }
        for (int64_t e = 0; e < V; ++e)
          dvr[e] = (accumulate ? dvr[e] : T(0)) + Vb[size_t(i * V + e)];
        T& db = dbeta[row * a.H + h];
        db = (accumulate ? db : T(0)) + betab[size_t(i)];
      }
      dS.swap(dS0);
    }
  });
}

template <typename T>
void kda_recurrent_forward(T* o, const KdaArgs<T>& a, T* state) {
  const int64_t K = a.K, V = a.V, HK = a.H * K, HV = a.H * V;
  struct Work {
    Buf<T> own, pred;
  };
  const auto make = [&] { return Work{Buf<T>(state ? 0 : size_t(K * V)), Buf<T>(size_t(V))}; };
  for_heads(a.B, a.H, make, [&](Work& w, int64_t b, int64_t h) {
    Buf<T>&own = w.own, &pred = w.pred;
    std::fill(own.begin(), own.end(), T(0));
    T* S = state ? state + (b * a.H + h) * K * V : own.data();
    for (int64_t t = 0; t < a.T_; ++t) {
      const int64_t row = b * a.T_ + t;
      const T* q = a.q + row * HK + h * K;
      const T* k = a.k + row * HK + h * K;
      const T* g = a.g + row * HK + h * K;
      const T* v = a.v + row * HV + h * V;
      const T bt = a.beta[row * a.H + h];
      std::fill(pred.begin(), pred.end(), T(0));
      for (int64_t c = 0; c < K; ++c) {  // decay, then S^T k
        const T d = std::exp(g[c]);
        for (int64_t e = 0; e < V; ++e) {
          S[c * V + e] *= d;
          pred[size_t(e)] += S[c * V + e] * k[c];
        }
      }
      for (int64_t e = 0; e < V; ++e) pred[size_t(e)] = bt * (v[e] - pred[size_t(e)]);
      T* orow = o + row * HV + h * V;
      std::fill(orow, orow + V, T(0));
      for (int64_t c = 0; c < K; ++c)
        for (int64_t e = 0; e < V; ++e) {
          S[c * V + e] += k[c] * pred[size_t(e)];
          orow[e] += S[c * V + e] * q[c];
        }
      for (int64_t e = 0; e < V; ++e) orow[e] *= a.scale;
    }
  });
}

// The recurrence's adjoint, token by token backwards (the benchmark's
// baseline for the chunkwise pair, and a second reference for its
// gradients). Per token, with S' = Diag(exp(g)) S_{t-1}, p = S'^T k,
// u = beta (v - p), S_t = S' + k u^T, o = scale S_t^T q, and dS the adjoint
// of S_t from the tokens after:
//   dS += scale q do^T, dq = scale S_t do;  du = dS^T k, dk = dS u;
//   dbeta = du . (v - p), dv = beta du, dp = -beta du;
//   dS' = dS + k dp^T, dk += S' dp, dg = rowsums(S' . dS'), dS = Diag(exp(g)) dS'.
// The states are kept every C tokens and each C-token stretch's states
// recomputed forward into a work buffer, C K V numbers.
template <typename T>
void kda_recurrent_backward(T* dq, T* dk, T* dv, T* dg, T* dbeta, const T* dout,
                            const KdaArgs<T>& a, bool accumulate) {
  const int64_t K = a.K, V = a.V, C = a.chunk, HK = a.H * K, HV = a.H * V;
  const int64_t chunks = (a.T_ + C - 1) / C;
  struct Work {
    Buf<T> starts, states, dS, dSp, u, du, dp, dec;
  };
  const auto make = [&] {
    const size_t KV = size_t(K * V);
    return Work{Buf<T>(size_t(chunks) * KV), Buf<T>(size_t(C + 1) * KV), Buf<T>(KV), Buf<T>(KV),
                Buf<T>(size_t(C * V)), Buf<T>(size_t(V)), Buf<T>(size_t(V)), Buf<T>(size_t(K))};
  };
  auto put = [&](T& dst, T v) { dst = (accumulate ? dst : T(0)) + v; };
  for_heads(a.B, a.H, make, [&](Work& w, int64_t b, int64_t h) {
    auto row_of = [&](int64_t t) { return b * a.T_ + t; };
    // One token forward: `to` = the state after token t from `from`, the
    // state before it; u = beta (v - p) kept.
    auto step = [&](const T* from, T* to, T* u, int64_t t) {
      const int64_t row = row_of(t);
      const T* k = a.k + row * HK + h * K;
      const T* g = a.g + row * HK + h * K;
      const T* v = a.v + row * HV + h * V;
      const T bt = a.beta[row * a.H + h];
      std::fill(u, u + V, T(0));
      for (int64_t c = 0; c < K; ++c) {
        const T d = std::exp(g[c]);
        for (int64_t e = 0; e < V; ++e) {
          to[c * V + e] = from[c * V + e] * d;
          u[e] += to[c * V + e] * k[c];
        }
      }
      for (int64_t e = 0; e < V; ++e) u[e] = bt * (v[e] - u[e]);
      for (int64_t c = 0; c < K; ++c)
        for (int64_t e = 0; e < V; ++e) to[c * V + e] += k[c] * u[e];
    };
    const int64_t KV = K * V;
    // The start states of the C-token stretches (ping-pong in states[0, 2)).
    std::fill(w.starts.begin(), w.starts.begin() + KV, T(0));
    for (int64_t c = 0; c + 1 < chunks; ++c) {
      std::copy(&w.starts[size_t(c * KV)], &w.starts[size_t((c + 1) * KV)], w.states.begin());
      for (int64_t i = 0; i < C; ++i)
        step(&w.states[size_t((i & 1) * KV)], &w.states[size_t((1 - (i & 1)) * KV)], w.u.data(), c * C + i);
      const auto last = w.states.begin() + (C & 1) * KV;  // where step C - 1 wrote
      std::copy(last, last + KV, &w.starts[size_t((c + 1) * KV)]);
    }
    std::fill(w.dS.begin(), w.dS.end(), T(0));
    for (int64_t c = chunks - 1; c >= 0; --c) {
      const int64_t t0 = c * C, n = std::min(C, a.T_ - t0);
      // states[i] = S after token t0 + i - 1 (states[0] the stretch's start).
      std::copy(&w.starts[size_t(c * KV)], &w.starts[size_t((c + 1) * KV)], w.states.begin());
      for (int64_t i = 0; i < n; ++i)
        step(&w.states[size_t(i * KV)], &w.states[size_t((i + 1) * KV)], &w.u[size_t(i * V)], t0 + i);
      for (int64_t i = n - 1; i >= 0; --i) {
        const int64_t row = row_of(t0 + i);
        const T* q = a.q + row * HK + h * K;
        const T* k = a.k + row * HK + h * K;
        const T* g = a.g + row * HK + h * K;
        const T* v = a.v + row * HV + h * V;
        const T* dor = dout + row * HV + h * V;
        const T bt = a.beta[row * a.H + h];
        const T* St = &w.states[size_t((i + 1) * KV)];
        const T* Sprev = &w.states[size_t(i * KV)];
        const T* u = &w.u[size_t(i * V)];
        T *dS = w.dS.data(), *dSp = w.dSp.data(), *du = w.du.data(), *dp = w.dp.data(),
          *dec = w.dec.data();
        // o = scale S_t^T q.
        for (int64_t c = 0; c < K; ++c) {
          T s = 0;
          for (int64_t e = 0; e < V; ++e) {
            dS[c * V + e] += a.scale * q[c] * dor[e];
            s += St[c * V + e] * dor[e];
          }
          put(dq[row * HK + h * K + c], a.scale * s);
        }
        // S_t = S' + k u^T.
        std::fill(du, du + V, T(0));
        for (int64_t c = 0; c < K; ++c)
          for (int64_t e = 0; e < V; ++e) du[e] += dS[c * V + e] * k[c];
        // u = beta (v - p), p = S'^T k (not u / beta: beta may be 0).
        std::fill(dp, dp + V, T(0));
        for (int64_t c = 0; c < K; ++c) {
          dec[c] = std::exp(g[c]);
          const T dkc = dec[c] * k[c];
          for (int64_t e = 0; e < V; ++e) dp[e] += Sprev[c * V + e] * dkc;  // p, for now
        }
        T db = 0;
        for (int64_t e = 0; e < V; ++e) {
          db += du[e] * (v[e] - dp[e]);
          put(dv[row * HV + h * V + e], bt * du[e]);
          dp[e] = -bt * du[e];
        }
        put(dbeta[row * a.H + h], db);
        // p = S'^T k, S' = Diag(exp(g)) S_{t-1}.
        for (int64_t c = 0; c < K; ++c) {
          const T d = dec[c];
          T sk = 0, sp = 0, sg = 0;
          for (int64_t e = 0; e < V; ++e) {
            const T Sp = Sprev[c * V + e] * d;
            dSp[c * V + e] = dS[c * V + e] + k[c] * dp[e];
            sk += dS[c * V + e] * u[e];
            sp += Sp * dp[e];
            sg += Sp * dSp[c * V + e];
          }
          put(dk[row * HK + h * K + c], sk + sp);
          put(dg[row * HK + h * K + c], sg);
          for (int64_t e = 0; e < V; ++e) dS[c * V + e] = d * dSp[c * V + e];
        }
      }
    }
  });
}

#define ATTNRES_KDA(T)                                                                          \
  template void kda_forward<T>(T*, const KdaArgs<T>&);                                          \
  template void kda_backward<T>(T*, T*, T*, T*, T*, const T*, const KdaArgs<T>&, bool);         \
  template void kda_recurrent_forward<T>(T*, const KdaArgs<T>&, T*);                             \
  template void kda_recurrent_backward<T>(T*, T*, T*, T*, T*, const T*, const KdaArgs<T>&, bool);
ATTNRES_KDA(float)
ATTNRES_KDA(double)
#undef ATTNRES_KDA

}  // namespace attnres::kernels::cpu
