// A literal, slow, double-precision transcription of docs/model.md section 2,
// written independently of src/model (plain vectors, no kernels) so the tests
// can check that the real model computes exactly the specified function.
#pragma once
#include <algorithm>
#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "model/config.h"

namespace attnres::reference {

using Vec = std::vector<double>;
using Seq = std::vector<Vec>;  // one vector per position

// Parameters fetched by name as flat row-major doubles.
using ParamFn = std::function<Vec(const std::string&)>;

inline Vec rmsnorm(const Vec& x, const Vec* g, double eps) {
  double ss = 0;
  for (double v : x) ss += v * v;
  double r = 1.0 / std::sqrt(ss / x.size() + eps);
  Vec y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = x[i] * r * (g ? (*g)[i] : 1.0);
  return y;
}

// y = W x for W [out, in] row-major.
inline Vec linear(const Vec& W, const Vec& x) {
  size_t in = x.size(), out = W.size() / in;
  Vec y(out, 0.0);
  for (size_t o = 0; o < out; ++o)
    for (size_t i = 0; i < in; ++i) y[o] += W[o * in + i] * x[i];
  return y;
}

inline Vec add(Vec a, const Vec& b) {
  for (size_t i = 0; i < a.size(); ++i) a[i] += b[i];
  return a;
}

// The depth Mix of sources vs before the sublayer (or the head) whose
// parameters start with `pre` ("model.layers.3.attn_res."), docs/model.md
// section 2 and "Residual variants": per head h (the channels in H groups),
//   a_jh = softmax_j(q_h . RMSNorm(v_jh))   (sigmoid instead: not normalised;
//          without the key norm: q_h . v_jh; scalars: softmax_j(s_j))
//   out_h = sum_j a_jh v_jh,
// q = w (static) or W v_k (input: v_k the most recent source, the last).
inline Vec depth_mix(const model::ModelConfig& c, const ParamFn& P, const std::string& pre,
                     const std::vector<Vec>& vs) {
  const auto& rv = c.variant;
  const bool scalars = rv.weights == model::MixWeights::Scalars;
  const size_t d = vs[0].size(), k = vs.size(), H = static_cast<size_t>(rv.heads), dh = d / H;
  Vec q, s;
  if (scalars) s = P(pre + "logits");
  else if (rv.query == model::MixQuery::Input) q = linear(P(pre + "query_proj.weight"), vs.back());
  else q = P(pre + "query");
  Vec out(d, 0.0);
  for (size_t h = 0; h < H; ++h) {
    std::vector<double> a(k);
    for (size_t j = 0; j < k; ++j) {
      if (scalars) {
        a[j] = s[j];
        continue;
      }
      Vec part(vs[j].begin() + h * dh, vs[j].begin() + (h + 1) * dh);
      if (rv.key_norm) part = rmsnorm(part, nullptr, c.norm_eps);
      double z = 0;
      for (size_t i = 0; i < dh; ++i) z += q[h * dh + i] * part[i];
      a[j] = z;
    }
    if (rv.score == kernels::MixScore::Sigmoid) {
      for (double& x : a) x = 1 / (1 + std::exp(-x));
    } else {
      double m = *std::max_element(a.begin(), a.end()), z = 0;
      for (double& x : a) z += (x = std::exp(x - m));
      for (double& x : a) x /= z;
    }
    for (size_t j = 0; j < k; ++j)
      for (size_t i = h * dh; i < (h + 1) * dh; ++i) out[i] += a[j] * vs[j][i];
  }
  return out;
}

// Hugging Face rotate-half RoPE at position t.
inline void rope(Vec& x, size_t n_heads, size_t hd, size_t t, double theta) {
  for (size_t h = 0; h < n_heads; ++h)
    for (size_t i = 0; i < hd / 2; ++i) {
      double ang = t * std::pow(theta, -2.0 * i / hd);
      double a = x[h * hd + i], b = x[h * hd + i + hd / 2];
      x[h * hd + i] = a * std::cos(ang) - b * std::sin(ang);
      x[h * hd + i + hd / 2] = b * std::cos(ang) + a * std::sin(ang);
    }
}

inline std::string lp(int64_t l, const std::string& s) {
  return "model.layers." + std::to_string(l) + "." + s;
}

// SwiGLU down(silu(gate u) * up u) with the projections named prefix + "{gate,up,down}_proj.weight".
inline Vec swiglu_mlp(const ParamFn& P, const std::string& prefix, const Vec& u) {
  Vec a = linear(P(prefix + "gate_proj.weight"), u);
  Vec b = linear(P(prefix + "up_proj.weight"), u);
  for (size_t i = 0; i < a.size(); ++i) a[i] = a[i] / (1 + std::exp(-a[i])) * b[i];
  return linear(P(prefix + "down_proj.weight"), a);
}

// A MoE layer's MLP (docs/model.md, "Mixture of experts") over one sequence
// of normalised inputs u[t]: each token's top_k experts by score + bias (ties
// to the lower index), their outputs weighted by scale s_j / sum of the
// chosen s, plus the shared experts. With a capacity factor, the sequence is
// the microbatch: an expert takes ceil(factor T top_k / E) slots, in token
// order, the rest dropped.
inline Seq moe_mlp(const model::ModelConfig& c, const ParamFn& P, int64_t l, const Seq& u) {
  const auto& m = c.moe;
  const size_t T = u.size(), E = static_cast<size_t>(m.experts), K = static_cast<size_t>(m.top_k);
  const Vec Wr = P(lp(l, "mlp.gate.weight"));
  const Vec bias = m.balance == model::MoeBalance::AuxFree
                       ? P(lp(l, "mlp.gate.e_score_correction_bias")) : Vec(E, 0.0);
  const size_t capacity = m.capacity_factor > 0
                              ? static_cast<size_t>(std::ceil(m.capacity_factor * T * K / E)) : T * K;
  std::vector<size_t> taken(E, 0);
  Seq y(T);
  for (size_t t = 0; t < T; ++t) {
    const Vec r = linear(Wr, u[t]);
    Vec s(E);
    double z = 0;
    for (size_t e = 0; e < E; ++e) z += std::exp(r[e]);
    for (size_t e = 0; e < E; ++e)
      s[e] = m.router == kernels::MoeRouter::Sigmoid ? 1 / (1 + std::exp(-r[e])) : std::exp(r[e]) / z;
    std::vector<size_t> order(E);
    for (size_t e = 0; e < E; ++e) order[e] = e;
    std::stable_sort(order.begin(), order.end(),
                     [&](size_t a, size_t b) { return s[a] + bias[a] > s[b] + bias[b]; });
    std::vector<size_t> chosen(order.begin(), order.begin() + K);
    std::sort(chosen.begin(), chosen.end());
    double sum = 0;
    for (size_t e : chosen) sum += s[e];
    y[t] = m.shared_experts > 0 ? swiglu_mlp(P, lp(l, "mlp.shared_experts."), u[t])
                                : Vec(u[t].size(), 0.0);
    for (size_t e : chosen) {
      if (taken[e]++ >= capacity) continue;  // dropped
      const Vec ye = swiglu_mlp(P, lp(l, "mlp.experts." + std::to_string(e) + "."), u[t]);
      for (size_t i = 0; i < ye.size(); ++i) y[t][i] += m.routed_scale * s[e] / sum * ye[i];
    }
  }
  return y;
}

// Whether layer l (0-based) is a KDA layer, from the model.kda keys:
// softmax attention in the 1-based layers listed, or those divisible by
// full_attention_every (4 when neither key is given) and the last.
inline bool kda_layer(const model::ModelConfig& c, int64_t l) {
  if (c.kda.heads <= 0) return false;
  const int64_t one_based = l + 1;
  const auto& list = c.kda.full_attention_layers;
  if (!list.empty()) return std::find(list.begin(), list.end(), one_based) == list.end();
  const int64_t every = c.kda.full_attention_every > 0 ? c.kda.full_attention_every : 4;
  return one_based % every != 0 && one_based != c.n_layers;
}

inline double sigmoid(double x) { return 1 / (1 + std::exp(-x)); }

// A KDA layer's attention (docs/model.md "KDA layer") on one sequence of
// normed inputs u[t], token by token from a zero state: q, k, v through
// their causal convolutions (from zeros before the sequence) and SiLU, q and
// k L2-normalised per head, the decay -exp(A_log) softplus(u W_fa^T W_fb^T +
// dt_bias), beta = sigmoid(u W_b^T), the delta-rule recurrence, the gated
// RMSNorm_K output (gain o_norm, eps model.norm_eps), o_proj.
inline Seq kda_attention(const model::ModelConfig& c, const ParamFn& P, int64_t l, const Seq& u) {
  const size_t T = u.size(), H = c.kda.heads, K = c.kda.head_dim, W = c.kda.conv_size, HK = H * K;
  auto p = [&](const std::string& name) { return P(lp(l, "self_attn." + name)); };
  const Vec Wq = p("q_proj.weight"), Wk = p("k_proj.weight"), Wv = p("v_proj.weight");
  const Vec Cq = p("q_conv1d.weight"), Ck = p("k_conv1d.weight"), Cv = p("v_conv1d.weight");
  const Vec A = p("A_log"), dt = p("dt_bias"), Fa = p("f_a_proj.weight"), Fb = p("f_b_proj.weight");
  const Vec Wb = p("b_proj.weight"), Ga = p("g_a_proj.weight"), Gb = p("g_b_proj.weight");
  const Vec on = p("o_norm.weight"), Wo = p("o_proj.weight");
  Seq pq(T), pk(T), pv(T);
  for (size_t t = 0; t < T; ++t) pq[t] = linear(Wq, u[t]), pk[t] = linear(Wk, u[t]), pv[t] = linear(Wv, u[t]);
  auto conv = [&](const Seq& x, const Vec& w, size_t t) {  // w [H K, 1, W] flat
    Vec y(HK);
    for (size_t ch = 0; ch < HK; ++ch) {
      double s = 0;
      for (size_t j = 0; j < W; ++j)
        if (t + j + 1 >= W) s += w[ch * W + j] * x[t + j + 1 - W][ch];
      y[ch] = s * sigmoid(s);
    }
    return y;
  };
  std::vector<Vec> S(H, Vec(K * K, 0.0));
  Seq y(T);
  for (size_t t = 0; t < T; ++t) {
    const Vec q = conv(pq, Cq, t), k = conv(pk, Ck, t), v = conv(pv, Cv, t);
    const Vec f = linear(Fb, linear(Fa, u[t])), z = linear(Gb, linear(Ga, u[t])), b = linear(Wb, u[t]);
    Vec out(HK);
    for (size_t h = 0; h < H; ++h) {
      double nq = 0, nk = 0;
      for (size_t i = 0; i < K; ++i) nq += q[h * K + i] * q[h * K + i], nk += k[h * K + i] * k[h * K + i];
      Vec qh(K), kh(K);
      for (size_t i = 0; i < K; ++i) qh[i] = q[h * K + i] / std::sqrt(nq + 1e-6), kh[i] = k[h * K + i] / std::sqrt(nk + 1e-6);
      Vec& St = S[h];
      for (size_t i = 0; i < K; ++i) {
        const double g = -std::exp(A[h]) * std::log1p(std::exp(f[h * K + i] + dt[h * K + i]));
        for (size_t e = 0; e < K; ++e) St[i * K + e] *= std::exp(g);
      }
      const double beta = sigmoid(b[h]);
      for (size_t e = 0; e < K; ++e) {
        double pred = 0;
        for (size_t i = 0; i < K; ++i) pred += St[i * K + e] * kh[i];
        for (size_t i = 0; i < K; ++i) St[i * K + e] += beta * kh[i] * (v[h * K + e] - pred);
      }
      Vec o(K, 0.0);
      double ss = 0;
      for (size_t e = 0; e < K; ++e) {
        for (size_t i = 0; i < K; ++i) o[e] += St[i * K + e] * qh[i];
        o[e] /= std::sqrt(double(K));
        ss += o[e] * o[e];
      }
      for (size_t e = 0; e < K; ++e)
        out[h * K + e] = o[e] / std::sqrt(ss / double(K) + c.norm_eps) * on[e] * sigmoid(z[h * K + e]);
    }
    y[t] = linear(Wo, out);
  }
  return y;
}

// Whether layer l is MLA: model.mla present and the layer not KDA.
inline bool mla_layer(const model::ModelConfig& c, int64_t l) {
  return c.mla.kv_lora_rank > 0 && !kda_layer(c, l);
}

// An MLA layer (docs/model.md "MLA layer") over one sequence of normalised
// inputs u[t], token by token: the latent, its norm, the per-head keys
// [k_n,h | k_r] with k_r shared, RoPE on the dr dims only with model.mla.rope.
inline Seq mla_attention(const model::ModelConfig& c, const ParamFn& P, int64_t l, const Seq& u) {
  const auto& m = c.mla;
  const size_t T = u.size(), H = c.n_heads, r = m.kv_lora_rank, dn = m.qk_nope_head_dim,
               dr = m.qk_rope_head_dim, dv = m.v_head_dim, dqk = dn + dr;
  const Vec Wq = P(lp(l, "self_attn.q_proj.weight")), Wa = P(lp(l, "self_attn.kv_a_proj_with_mqa.weight"));
  const Vec g = P(lp(l, "self_attn.kv_a_layernorm.weight")), Wb = P(lp(l, "self_attn.kv_b_proj.weight"));
  // keys[t][h], values[t][h], queries[t][h]
  std::vector<std::vector<Vec>> qs(T), ks(T), vs(T);
  for (size_t t = 0; t < T; ++t) {
    const Vec q = linear(Wq, u[t]), ca = linear(Wa, u[t]);
    const Vec ckv(ca.begin(), ca.begin() + r);
    Vec kr(ca.begin() + r, ca.end());
    const Vec kv = linear(Wb, rmsnorm(ckv, &g, c.norm_eps));
    if (m.rope) rope(kr, 1, dr, t, c.rope_theta);
    for (size_t h = 0; h < H; ++h) {
      Vec qh(q.begin() + h * dqk, q.begin() + (h + 1) * dqk);
      if (m.rope) {
        Vec tail(qh.begin() + dn, qh.end());
        rope(tail, 1, dr, t, c.rope_theta);
        std::copy(tail.begin(), tail.end(), qh.begin() + dn);
      }
      Vec kh(kv.begin() + h * (dn + dv), kv.begin() + h * (dn + dv) + dn);
      kh.insert(kh.end(), kr.begin(), kr.end());
      qs[t].push_back(qh);
      ks[t].push_back(kh);
      vs[t].push_back(Vec(kv.begin() + h * (dn + dv) + dn, kv.begin() + (h + 1) * (dn + dv)));
    }
  }
  Seq y(T);
  for (size_t t = 0; t < T; ++t) {
    Vec att(H * dv, 0.0);
    for (size_t h = 0; h < H; ++h) {
      std::vector<double> sc(t + 1);
      for (size_t s2 = 0; s2 <= t; ++s2) {
        double d = 0;
        for (size_t i = 0; i < dqk; ++i) d += qs[t][h][i] * ks[s2][h][i];
        sc[s2] = d / std::sqrt(double(dqk));
      }
      double mx = *std::max_element(sc.begin(), sc.end()), z = 0;
      for (double& e : sc) z += (e = std::exp(e - mx));
      for (size_t s2 = 0; s2 <= t; ++s2)
        for (size_t i = 0; i < dv; ++i) att[h * dv + i] += sc[s2] / z * vs[s2][h][i];
    }
    y[t] = linear(P(lp(l, "self_attn.o_proj.weight")), att);
  }
  return y;
}

// f_s applied to a whole sequence of sublayer inputs x[t].
inline Seq sublayer(const model::ModelConfig& c, const ParamFn& P, int64_t s, const Seq& x) {
  const size_t T = x.size(), H = c.n_heads, Hkv = c.n_kv_heads, hd = c.d_model / c.n_heads;
  const int64_t l = s / 2;
  Seq u(T), y(T);
  if (s % 2 == 0 && kda_layer(c, l)) {
    Vec g = P(lp(l, "input_layernorm.weight"));
    for (size_t t = 0; t < T; ++t) u[t] = rmsnorm(x[t], &g, c.norm_eps);
    return kda_attention(c, P, l, u);
  }
  if (s % 2 == 0 && mla_layer(c, l)) {
    Vec g = P(lp(l, "input_layernorm.weight"));
    for (size_t t = 0; t < T; ++t) u[t] = rmsnorm(x[t], &g, c.norm_eps);
    return mla_attention(c, P, l, u);
  }
  if (s % 2 == 0) {
    Vec g = P(lp(l, "input_layernorm.weight"));
    Seq q(T), k(T), v(T);
    for (size_t t = 0; t < T; ++t) {
      u[t] = rmsnorm(x[t], &g, c.norm_eps);
      q[t] = linear(P(lp(l, "self_attn.q_proj.weight")), u[t]);
      k[t] = linear(P(lp(l, "self_attn.k_proj.weight")), u[t]);
      v[t] = linear(P(lp(l, "self_attn.v_proj.weight")), u[t]);
      rope(q[t], H, hd, t, c.rope_theta);
      rope(k[t], Hkv, hd, t, c.rope_theta);
    }
    for (size_t t = 0; t < T; ++t) {
      Vec att(H * hd, 0.0);
      for (size_t h = 0; h < H; ++h) {
        size_t j = h / (H / Hkv);  // KV head serving query head h
        std::vector<double> sc(t + 1);
        for (size_t s2 = 0; s2 <= t; ++s2) {
          double d = 0;
          for (size_t i = 0; i < hd; ++i) d += q[t][h * hd + i] * k[s2][j * hd + i];
          sc[s2] = d / std::sqrt(double(hd));
        }
        double m = *std::max_element(sc.begin(), sc.end()), z = 0;
        for (double& e : sc) z += (e = std::exp(e - m));
        for (size_t s2 = 0; s2 <= t; ++s2)
          for (size_t i = 0; i < hd; ++i) att[h * hd + i] += sc[s2] / z * v[s2][j * hd + i];
      }
      y[t] = linear(P(lp(l, "self_attn.o_proj.weight")), att);
    }
  } else {
    Vec g = P(lp(l, "post_attention_layernorm.weight"));
    for (size_t t = 0; t < T; ++t) u[t] = rmsnorm(x[t], &g, c.norm_eps);
    // The MoE section's layers from dense_layers on, read from the keys.
    if (c.moe.experts > 0 && l >= c.moe.dense_layers) return moe_mlp(c, P, l, u);
    for (size_t t = 0; t < T; ++t) y[t] = swiglu_mlp(P, lp(l, "mlp."), u[t]);
  }
  return y;
}

// S, the sublayers per block, from the keys as docs/model.md section 1 gives
// it (not ModelConfig::resolved_block_size: the reference reads every key
// itself): 1 for full, model.residual.block_size, or ceil(2L / n_blocks).
inline size_t block_size(const model::ModelConfig& c) {
  if (c.mode == model::ResidualMode::Full) return 1;
  if (c.block_size > 0) return static_cast<size_t>(c.block_size);
  return static_cast<size_t>((2 * c.n_layers + c.n_blocks - 1) / c.n_blocks);
}

// The logits of every position of one sequence, straight from docs/model.md section 2.
inline Seq sequence_logits(const model::ModelConfig& c, const ParamFn& P,
                           const std::vector<int32_t>& tokens) {
  const size_t T = tokens.size(), d = c.d_model, L2 = 2 * c.n_layers;
  Vec E = P("model.embed_tokens.weight");
  Seq e(T);
  for (size_t t = 0; t < T; ++t) e[t] = Vec(E.begin() + tokens[t] * d, E.begin() + (tokens[t] + 1) * d);

  Seq z(T);
  // DenseFormer: X_0 = e; layer l's input is X_0 (l = 0) or sum_{j <= l}
  // a_{l,j} X_j, its PreNorm stream inside; X_{l+1} its output; z the head's
  // average over X_0 .. X_L (docs/model.md "DenseFormer").
  auto dwa = [&](const Vec& a, const std::vector<Seq>& X, size_t t) {
    Vec out(d, 0.0);
    for (size_t j = 0; j < X.size(); ++j)
      for (size_t i = 0; i < d; ++i) out[i] += a[j] * X[j][t][i];
    return out;
  };
  if (c.mode == model::ResidualMode::DenseFormer) {
    std::vector<Seq> X{e};
    for (size_t l = 0; l < static_cast<size_t>(c.n_layers); ++l) {
      Seq h(T);
      const Vec a = l > 0 ? P(lp(l, "attn_res.dwa")) : Vec{};
      for (size_t t = 0; t < T; ++t) h[t] = l == 0 ? e[t] : dwa(a, X, t);
      for (size_t s = 2 * l; s < 2 * l + 2; ++s) {
        const Seq y = sublayer(c, P, s, h);
        for (size_t t = 0; t < T; ++t) h[t] = add(h[t], y[t]);
      }
      X.push_back(h);
    }
    const Vec a = P("model.final_res.dwa");
    for (size_t t = 0; t < T; ++t) z[t] = dwa(a, X, t);
  } else if (c.mode == model::ResidualMode::Baseline) {
    Seq x = e;  // x_s = e + sum_{i<s} y_i
    for (size_t s = 0; s < L2; ++s) {
      Seq y = sublayer(c, P, s, x);
      for (size_t t = 0; t < T; ++t) x[t] = add(x[t], y[t]);
    }
    z = x;
  } else {
    // Block AttnRes (full = S 1): blocks b_0 = e, b_n = sum of block n's outputs.
    const size_t S = block_size(c);
    std::vector<Seq> blocks{e};
    Seq partial;  // empty = no partial
    // Position t of every block, then of the partial sum; with a depth window
    // W (full mode) only the embedding and the W most recent outputs.
    const size_t W = static_cast<size_t>(c.variant.window);
    auto sources_at = [W](const std::vector<Seq>& bs, const Seq& p, size_t t) {
      std::vector<Vec> src;
      for (size_t j = 0; j < bs.size(); ++j)
        if (W == 0 || j == 0 || j + W >= bs.size()) src.push_back(bs[j][t]);
      if (!p.empty()) src.push_back(p[t]);
      return src;
    };
    for (size_t s = 0; s < L2; ++s) {
      const size_t i = s % S;
      const std::string pre = lp(s / 2, s % 2 == 0 ? "attn_res." : "mlp_res.");
      Seq x(T);
      for (size_t t = 0; t < T; ++t) x[t] = depth_mix(c, P, pre, sources_at(blocks, partial, t));
      Seq y = sublayer(c, P, s, x);
      if (i == 0) partial = y;
      else for (size_t t = 0; t < T; ++t) partial[t] = add(partial[t], y[t]);
      if (i == S - 1) {
        blocks.push_back(partial);
        partial.clear();
      }
    }
    // (a partial only when 2L % S != 0)
    for (size_t t = 0; t < T; ++t)
      z[t] = depth_mix(c, P, "model.final_res.", sources_at(blocks, partial, t));
  }
  Vec g = P("model.norm.weight");
  Vec W = P(c.tie_embeddings ? "model.embed_tokens.weight" : "lm_head.weight");
  Seq logits(T);
  for (size_t t = 0; t < T; ++t) logits[t] = linear(W, rmsnorm(z[t], &g, c.norm_eps));
  return logits;
}

// log softmax of one row of logits.
inline Vec log_softmax(const Vec& logits) {
  double m = *std::max_element(logits.begin(), logits.end()), sum = 0;
  for (double v : logits) sum += std::exp(v - m);
  Vec out(logits.size());
  for (size_t i = 0; i < logits.size(); ++i) out[i] = logits[i] - m - std::log(sum);
  return out;
}

// Summed token cross-entropy of one sequence.
inline double sequence_loss(const model::ModelConfig& c, const ParamFn& P,
                            const std::vector<int32_t>& tokens, const std::vector<int32_t>& targets) {
  const Seq logits = sequence_logits(c, P, tokens);
  double loss = 0;
  for (size_t t = 0; t < logits.size(); ++t) {
    const Vec& l = logits[t];
    double m = *std::max_element(l.begin(), l.end()), sum = 0;
    for (double v : l) sum += std::exp(v - m);
    loss += m + std::log(sum) - l[targets[t]];
  }
  return loss;
}

}  // namespace attnres::reference
