// One KDA sublayer from the ops of kernels/kda.h and GEMMs (see kda_layer.h).
#include "model/kda_layer.h"

#include <cmath>

#include "kernels/kda.h"
#include "kernels/matmul.h"

namespace attnres::model {

namespace kern = attnres::kernels;

namespace {

constexpr double kL2Eps = 1e-6;  // q and k's L2 norm (docs/model.md, step 2)

Tensor like(const Tensor& u, int64_t cols) { return Tensor::empty({u.dim(0), cols}, u.dtype(), u.device()); }

kern::KdaShape core_shape(const KdaDims& d, int64_t B, int64_t T) {
  return {B, T, d.H, d.K, d.K, d.chunk};
}

// x W^T through the convolution and SiLU: the projection before and after.
// Decoding (win given, one token): the token's projection enters the
// window's last row, the convolution runs over the window as one sequence
// of W rows, its last row is the token's output, and the window moves on.
void conv_branch(Tensor& pre, Tensor& post, const Tensor& u, const Tensor& proj, const Tensor& conv,
                 int64_t B, int64_t T, Tensor* win) {
  pre = like(u, proj.dim(0));
  kern::matmul_forward(pre, u, proj);
  post = like(u, proj.dim(0));
  if (!win) {
    kern::kda_conv_forward(post, pre, conv, B, T);
    return;
  }
  const int64_t W = win->dim(0);
  win->rows(W - 1, 1).copy_from(pre);
  Tensor out = Tensor::empty(win->shape(), win->dtype(), win->device());
  kern::kda_conv_forward(out, *win, conv, 1, W);
  post.copy_from(out.rows(W - 1, 1));
  if (W > 1) win->rows(0, W - 1).copy_from(win->rows(1, W - 1).clone());  // no overlapping copy
}

}  // namespace

KdaWeights kda_weights(const KdaParams& p, Tensor Param::*of) {
  auto flat2 = [&](Param* x) {  // [H K, 1, W] -> [H K, W]
    const Tensor& t = x->*of;
    return t.reshape({t.dim(0), t.numel() / t.dim(0)});
  };
  const Tensor& a = p.a_log->*of;
  return {p.q->*of,       p.k->*of,        p.v->*of,   flat2(p.q_conv), flat2(p.k_conv),
          flat2(p.v_conv), a.reshape({a.numel()}), p.dt_bias->*of, p.f_a->*of, p.f_b->*of,
          p.b->*of,        p.g_a->*of,      p.g_b->*of, p.o_norm->*of, p.o->*of};
}

void kda_layer_forward(Tensor& y, KdaActs& a, const Tensor& u, const KdaWeights& w,
                       const KdaDims& d, int64_t B, int64_t T, const Tensor* residual) {
  kda_layer_core(a, u, w, d, B, T);
  kern::matmul_forward(y, a.gated, w.o, residual);
}

KdaCache kda_new_cache(const KdaDims& d, DType dtype, Device device) {
  const int64_t HK = d.H * d.K;
  // The recurrent state in fp32 on a GPU (kernels/kda.h), the model's dtype on the CPU.
  const DType state = device == Device::CUDA ? DType::F32 : dtype;
  return {Tensor::zeros({1, d.H, d.K, d.K}, state, device), Tensor::zeros({d.conv, HK}, dtype, device),
          Tensor::zeros({d.conv, HK}, dtype, device), Tensor::zeros({d.conv, HK}, dtype, device)};
}

void kda_layer_core(KdaActs& a, const Tensor& u, const KdaWeights& w, const KdaDims& d, int64_t B,
                    int64_t T, KdaCache* cache) {
  const int64_t HK = d.H * d.K;
  ATTNRES_CHECK(!cache || (B == 1 && T == 1), "decoding feeds one token at a time");
  conv_branch(a.pq, a.cq, u, w.q, w.q_conv, B, T, cache ? &cache->win_q : nullptr);
  conv_branch(a.pk, a.ck, u, w.k, w.k_conv, B, T, cache ? &cache->win_k : nullptr);
  conv_branch(a.pv, a.cv, u, w.v, w.v_conv, B, T, cache ? &cache->win_v : nullptr);
  a.qn = like(u, HK);
  a.kn = like(u, HK);
  kern::kda_l2norm_forward(a.qn, a.cq, d.K, kL2Eps);
  kern::kda_l2norm_forward(a.kn, a.ck, d.K, kL2Eps);
  // The decay from its low-rank path, the write strength per head.
  a.fa = like(u, d.K);
  kern::matmul_forward(a.fa, u, w.f_a);
  a.f = like(u, HK);
  kern::matmul_forward(a.f, a.fa, w.f_b);
  a.g = like(u, HK);
  kern::kda_decay_forward(a.g, a.f, w.a_log, w.dt_bias, d.K);
  Tensor bl = like(u, d.H);
  kern::matmul_forward(bl, u, w.b);
  a.beta = like(u, d.H);
  kern::kda_beta_forward(a.beta, bl);
  a.core = like(u, HK);
  const double scale = 1 / std::sqrt(static_cast<double>(d.K));
  if (cache)  // one step of the recurrence from the cached state
    kern::kda_recurrent_forward(a.core, a.qn, a.kn, a.cv, a.g, a.beta, core_shape(d, B, T), scale,
                                &cache->state);
  else
    kern::kda_forward(a.core, a.qn, a.kn, a.cv, a.g, a.beta, core_shape(d, B, T), scale);
  // The gated output norm, then o_proj.
  a.ga = like(u, d.K);
  kern::matmul_forward(a.ga, u, w.g_a);
  a.z = like(u, HK);
  kern::matmul_forward(a.z, a.ga, w.g_b);
  a.gated = like(u, HK);
  kern::kda_out_gate_forward(a.gated, a.core, w.o_norm, a.z, d.K, d.norm_eps);
}

void kda_layer_backward(Tensor& du, KdaWeights& grad, const KdaActs& a, const Tensor& u,
                        const Tensor& dy, const KdaWeights& w, const KdaDims& d, int64_t B,
                        int64_t T) {
  const int64_t HK = d.H * d.K;
  const kern::Store set = kern::Store::Set, add = kern::Store::Add;
  // o_proj and the output gate.
  Tensor dgated = like(u, HK), dcore = like(u, HK), dz = like(u, HK), dga = like(u, d.K);
  kern::matmul_backward(&dgated, &grad.o, dy, a.gated, w.o, set);
  kern::kda_out_gate_backward(dcore, grad.o_norm, dz, dgated, a.core, w.o_norm, a.z, d.K,
                              d.norm_eps, set);
  kern::matmul_backward(&dga, &grad.g_b, dz, a.ga, w.g_b, set);
  kern::matmul_backward(&du, &grad.g_a, dga, u, w.g_a, set);  // du's first term, written
  // The core.
  Tensor dqn = like(u, HK), dkn = like(u, HK), dcv = like(u, HK), dg = like(u, HK),
         dbeta = like(u, d.H);
  kern::kda_backward(dqn, dkn, dcv, dg, dbeta, dcore, a.qn, a.kn, a.cv, a.g, a.beta,
                     core_shape(d, B, T), 1 / std::sqrt(static_cast<double>(d.K)), set);
  // The write strength and the decay.
  Tensor dbl = like(u, d.H), df = like(u, HK), dfa = like(u, d.K);
  kern::kda_beta_backward(dbl, dbeta, a.beta, set);
  kern::matmul_backward(&du, &grad.b, dbl, u, w.b, add);
  kern::kda_decay_backward(df, grad.a_log, grad.dt_bias, dg, a.f, w.a_log, w.dt_bias, d.K, set);
  kern::matmul_backward(&dfa, &grad.f_b, df, a.fa, w.f_b, set);
  kern::matmul_backward(&du, &grad.f_a, dfa, u, w.f_a, add);
  // q, k (through their norms) and v, each through its convolution and projection.
  Tensor dc = like(u, HK), dp = like(u, HK);
  auto branch = [&](const Tensor& dout, bool normed, const Tensor& pre, const Tensor& post,
                    const Tensor& conv, const Tensor& proj, Tensor& dconv, Tensor& dproj) {
    const Tensor* dpost = &dout;
    if (normed) {
      kern::kda_l2norm_backward(dc, dout, post, d.K, kL2Eps, set);
      dpost = &dc;
    }
    kern::kda_conv_backward(dp, dconv, *dpost, pre, conv, B, T, set);
    kern::matmul_backward(&du, &dproj, dp, u, proj, add);
  };
  branch(dqn, true, a.pq, a.cq, w.q_conv, w.q, grad.q_conv, grad.q);
  branch(dkn, true, a.pk, a.ck, w.k_conv, w.k, grad.k_conv, grad.k);
  branch(dcv, false, a.pv, a.cv, w.v_conv, w.v, grad.v_conv, grad.v);
}

}  // namespace attnres::model
