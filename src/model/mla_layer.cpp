// One MLA sublayer from GEMMs, our RMSNorm, the expansion of kernels/mla.h
// and our attention (see mla_layer.h).
#include "model/mla_layer.h"

#include "kernels/attention.h"
#include "kernels/common.h"
#include "kernels/matmul.h"
#include "kernels/rmsnorm.h"

namespace attnres::model {

namespace kern = attnres::kernels;

namespace {

Tensor like(const Tensor& u, int64_t cols) {
  return Tensor::empty({u.dim(0), cols}, u.dtype(), u.device());
}
// kv_a_proj_with_mqa's two row blocks: c_kv's r rows, then k_r's dr.
Tensor ckv_rows(const Tensor& kv_a, const MlaDims& d) { return kv_a.rows(0, d.r); }
Tensor kr_rows(const Tensor& kv_a, const MlaDims& d) { return kv_a.rows(d.r, d.dr); }

}  // namespace

MlaWeights mla_weights(const MlaParams& p, Tensor Param::*of) {
  return {p.q->*of, p.kv_a->*of, p.kv_norm->*of, p.kv_b->*of, p.o->*of};
}

void mla_layer_core(MlaActs& a, const Tensor& u, const MlaWeights& w, const MlaDims& d, int64_t B,
                    int64_t T, MlaCache* cache) {
  const int64_t N = B * T;
  const kern::MlaShape s = d.shape(B, T);
  Tensor q = like(u, d.H * s.dqk()), kr = like(u, d.dr), kv = like(u, d.H * (d.dn + d.dv));
  kern::matmul_forward(q, u, w.q);
  a.ckv = like(u, d.r);
  kern::matmul_forward(a.ckv, u, ckv_rows(w.kv_a, d));
  if (d.dr > 0) kern::matmul_forward(kr, u, kr_rows(w.kv_a, d));
  a.cn = like(u, d.r);
  a.ckv_rstd = Tensor::empty({N}, kern::stat_dtype(u.dtype()), u.device());
  kern::rmsnorm_forward(a.cn, a.ckv_rstd, a.ckv, &w.kv_norm, static_cast<float>(d.norm_eps));
  kern::matmul_forward(kv, a.cn, w.kv_b);
  const kern::AttnShape as = s.attn();
  a.qkv = like(u, kern::qkv_width(as));
  kern::mla_expand_forward(a.qkv, q, kv, kr, s, d.rope_theta, cache ? cache->pos : 0);
  a.att = like(u, d.H * d.dv);
  if (!cache) {
    a.lse = Tensor::empty({B, d.H, T}, kern::stat_dtype(u.dtype()), u.device());
    kern::attention_forward(a.att, a.lse, a.qkv, as);
    return;
  }
  // One new token: its expanded key and value into the cache, then its
  // query over the cache. The row's three blocks, seen element-wise.
  ATTNRES_CHECK(B == 1 && T == 1, "decoding feeds one token at a time");
  ATTNRES_CHECK(cache->pos < cache->max_len, "decode cache full (", cache->max_len, " tokens)");
  const int64_t qk = d.H * s.dqk(), vw = d.H * d.dv;
  const Tensor row = a.qkv.reshape({a.qkv.numel(), 1});
  cache->k.reshape({cache->max_len, qk}).rows(cache->pos, 1).copy_from(row.rows(qk, qk));
  cache->v.reshape({cache->max_len, vw}).rows(cache->pos, 1).copy_from(row.rows(2 * qk, vw));
  kern::attention_decode(a.att, row.rows(0, qk).reshape({1, qk}), cache->k, cache->v,
                         cache->pos + 1, as);
}

void mla_layer_backward(Tensor& du, MlaWeights& grad, const MlaActs& a, const Tensor& u,
                        const Tensor& dy, const MlaWeights& w, const MlaDims& d, int64_t B,
                        int64_t T) {
  const kern::Store set = kern::Store::Set, add = kern::Store::Add;
  const kern::MlaShape s = d.shape(B, T);
  // o_proj, then the attention over the expanded heads.
  Tensor datt = like(u, d.H * d.dv);
  kern::matmul_backward(&datt, &grad.o, dy, a.att, w.o, set);
  Tensor dqkv = like(u, kern::qkv_width(s.attn()));
  kern::attention_backward(dqkv, datt, a.qkv, a.att, a.lse, s.attn(), set);
  // The expansion's transpose: the queries, [k_n | v] per head, k_r summed
  // over the heads.
  Tensor dq = like(u, d.H * s.dqk()), dkv = like(u, d.H * (d.dn + d.dv)), dkr = like(u, d.dr);
  kern::mla_expand_backward(dq, dkv, dkr, dqkv, s, d.rope_theta);
  kern::matmul_backward(&du, &grad.q, dq, u, w.q, set);  // du's first term, written
  // The latent path: kv_b_proj, the latent norm, c_kv's and k_r's rows of
  // kv_a_proj_with_mqa.
  Tensor dcn = like(u, d.r), dckv = like(u, d.r);
  kern::matmul_backward(&dcn, &grad.kv_b, dkv, a.cn, w.kv_b, set);
  kern::rmsnorm_backward(dckv, &grad.kv_norm, dcn, a.ckv, a.ckv_rstd, &w.kv_norm, set);
  Tensor dw_ckv = ckv_rows(grad.kv_a, d);
  kern::matmul_backward(&du, &dw_ckv, dckv, u, ckv_rows(w.kv_a, d), add);
  if (d.dr > 0) {
    Tensor dw_kr = kr_rows(grad.kv_a, d);
    kern::matmul_backward(&du, &dw_kr, dkr, u, kr_rows(w.kv_a, d), add);
  }
}

}  // namespace attnres::model
