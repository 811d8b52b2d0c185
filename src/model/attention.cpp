// The attention sublayer (grouped-query softmax attention with RoPE,
// docs/model.md section 2): forward to its output projection, the core that
// recomputation redoes, decoding over the KV cache, and the backward. A
// hybrid's KDA layers (model.kda) run model/kda_layer.h instead, MLA layers
// (model.mla) model/mla_layer.h.
#include "model/model.h"

#include "kernels/attention.h"
#include "kernels/matmul.h"
#include "kernels/rope.h"
#include "model/sublayer_common.h"

namespace attnres::model {

namespace kern = attnres::kernels;

using sublayer::qkv_of;

void Model::attention_forward(int64_t l, SublayerActs& a, Tensor& y, int64_t B, int64_t T,
                              DecodeCache* cache, const Tensor* residual) const {
  attention_core(l, a, B, T, cache);
  kern::matmul_forward(y, out_proj_input(2 * l, a), out_proj_of(2 * l).value, residual);
}

// q, k and v in one GEMM: qkv = u [Wq; Wk; Wv]^T is [N, (H + 2 Hkv) hd], each
// row q | k | v (kernels/attention.h), read in place by RoPE and attention.
// The GEMMs name W's three blocks: the CPU runs one GEMM per projection (the
// bits it computed before they were joined, kernels/matmul.h).
void Model::attention_core(int64_t l, SublayerActs& a, int64_t B, int64_t T,
                           DecodeCache* cache) const {
  if (cfg_.kda_layer(l)) {  // Kimi Delta Attention (model/kda_layer.h)
    kda_layer_core(a.kda, a.u, kda_weights(layer(l).kda, &Param::value), kda_dims(), B, T,
                   cache ? &cache->kda[static_cast<size_t>(l)] : nullptr);
    return;
  }
  if (cfg_.mla_layer(l)) {  // multi-head latent attention (model/mla_layer.h)
    MlaCache mc;
    if (cache) mc = {cache->k[l], cache->v[l], cache->pos, cache->max_len};
    mla_layer_core(a.mla, a.u, mla_weights(layer(l).mla, &Param::value), mla_dims(), B, T,
                   cache ? &mc : nullptr);
    return;
  }
  const int64_t N = B * T, H = cfg_.n_heads, Hkv = cfg_.n_kv_heads, hd = cfg_.head_dim();
  const float theta = static_cast<float>(cfg_.rope_theta);
  const LayerParams& L = layer(l);
  const kern::AttnShape shape{B, T, H, Hkv, hd};
  a.qkv = new_act(N, kern::qkv_width(shape));
  kern::matmul_forward(a.qkv, a.u, qkv_of(L.q->value, L.k->value, L.v->value, l), nullptr,
                       kern::qkv_row_blocks(shape));
  // q's and k's heads are adjacent in each row and take the same rotation.
  const int64_t pos0 = cache ? cache->pos : 0;
  kern::rope_forward(a.qkv, B, T, H + Hkv, hd, theta, pos0);
  a.att = new_act(N, H * hd);
  if (cache) {  // one new token: append its k/v, attend over the cache
    ATTNRES_CHECK(B == 1 && T == 1, "decoding feeds one token at a time");
    ATTNRES_CHECK(cache->pos < cache->max_len, "decode cache full (", cache->max_len, " tokens)");
    // The token's one row, seen as its H + 2 Hkv heads: q's, k's, v's.
    const Tensor heads = a.qkv.reshape({H + 2 * Hkv, hd});
    cache->k[l].reshape({cache->max_len, Hkv * hd}).rows(cache->pos, 1)
        .copy_from(heads.rows(H, Hkv));
    cache->v[l].reshape({cache->max_len, Hkv * hd}).rows(cache->pos, 1)
        .copy_from(heads.rows(H + Hkv, Hkv));
    kern::attention_decode(a.att, heads.rows(0, H).reshape({1, H * hd}), cache->k[l],
                           cache->v[l], cache->pos + 1, {1, 1, H, Hkv, hd});
  } else {
    a.lse = new_stat({B, H, T});
    kern::attention_forward(a.att, a.lse, a.qkv, shape, attention_kernel_);
  }
}

Tensor Model::attention_backward(int64_t l, SublayerActs& a, const Tensor& dy, int64_t B,
                                 int64_t T) {
  if (cfg_.kda_layer(l)) {
    const KdaParams& P = layer(l).kda;
    KdaWeights grads = kda_weights(P, &Param::grad);
    Tensor du = new_act(B * T, cfg_.d_model);
    kda_layer_backward(du, grads, a.kda, a.u, dy, kda_weights(P, &Param::value), kda_dims(), B, T);
    return du;
  }
  if (cfg_.mla_layer(l)) {
    const MlaParams& P = layer(l).mla;
    MlaWeights grads = mla_weights(P, &Param::grad);
    Tensor du = new_act(B * T, cfg_.d_model);
    mla_layer_backward(du, grads, a.mla, a.u, dy, mla_weights(P, &Param::value), mla_dims(), B, T);
    return du;
  }
  const int64_t N = B * T, H = cfg_.n_heads, Hkv = cfg_.n_kv_heads, hd = cfg_.head_dim();
  const float theta = static_cast<float>(cfg_.rope_theta);
  const LayerParams& L = layer(l);
  Param& wo = *L.o;
  const kern::AttnShape shape{B, T, H, Hkv, hd};
  // Activation gradients are written (Store::Set), not zeroed and
  // accumulated into: each has one producer.
  Tensor datt = new_act(N, H * hd);
  kern::matmul_backward(&datt, &wo.grad, dy, a.att, wo.value, kern::Store::Set);
  Tensor dqkv = new_act(N, kern::qkv_width(shape));
  kern::attention_backward(dqkv, datt, a.qkv, a.att, a.lse, shape, kern::Store::Set,
                           attention_kernel_);
  kern::rope_backward(dqkv, B, T, H + Hkv, hd, theta);
  // du = dq Wq + dk Wk + dv Wv = dqkv [Wq; Wk; Wv] and the three weight
  // gradients dqkv^T u, each one GEMM.
  Tensor du = new_act(N, cfg_.d_model);
  Tensor dw = qkv_of(L.q->grad, L.k->grad, L.v->grad, l);
  kern::matmul_backward(&du, &dw, dqkv, a.u, qkv_of(L.q->value, L.k->value, L.v->value, l),
                        kern::Store::Set, kern::qkv_row_blocks(shape));
  return du;
}

}  // namespace attnres::model
