// Mixture-of-experts dispatcher: argument checks and dtype dispatch.
#include "kernels/moe.h"

#include "kernels/common.h"
#include "kernels/cpu/moe.h"

namespace attnres::kernels {

namespace {

// The routing's [N, K] tensors must match the logits [N, E].
void check_routing(const char* op, const MoeRouting& r, const Tensor& logits) {
  check_2d(op, "logits", logits);
  ATTNRES_CHECK(r.N == logits.dim(0) && r.E == logits.dim(1) && r.expert.defined() &&
                    static_cast<int64_t>(r.offsets.size()) == r.E + 1,
                op, ": the routing is of ", r.N, " tokens over ", r.E, " experts, the logits ",
                shape_str(logits.shape()));
}

// The CUDA kernels of the MoE layer are not written yet: a CUDA tensor
// stops here with that said.
void cpu_only(const char* op, const Tensor& t) {
  if (t.is_cuda())
    fail(op, ": mixture-of-experts layers run on the CPU only so far (no CUDA kernels yet)");
}

// y-like [M, d] and u-like [N, d] tensors of one routing.
void check_rows(const char* op, const char* name, const Tensor& t, const Tensor& ref, int64_t rows,
                int64_t d) {
  check_arg(op, name, t, ref, {rows, d});
}

}  // namespace

void moe_route(MoeRouting& r, const Tensor& logits, const Tensor* bias,
               const MoeRouteOptions& opt) {
  const char* op = "moe_route";
  check_2d(op, "logits", logits);
  const int64_t N = logits.dim(0), E = logits.dim(1), K = opt.top_k;
  ATTNRES_CHECK(K >= 1 && K <= E, op, ": top_k ", K, " of ", E, " experts");
  if (bias) check_arg(op, "bias", *bias, logits, {E});
  cpu_only(op, logits);
  r = MoeRouting{};
  r.N = N;
  r.E = E;
  r.K = K;
  r.expert = Tensor::empty({N, K}, DType::I32, logits.device());
  r.gate = Tensor::empty({N, K}, logits.dtype(), logits.device());
  r.row = Tensor::empty({N, K}, DType::I32, logits.device());
  std::vector<int32_t> token;
  dispatch_cpu_float(logits, op, [&](auto tag) {
    using T = decltype(tag);
    cpu::moe_route<T>(logits.data<T>(), bias ? bias->data<T>() : nullptr, N, E, opt,
                      r.expert.data<int32_t>(), r.gate.data<T>(), r.row.data<int32_t>(), token,
                      r.offsets, r.load, r.dropped);
  });
  r.token = Tensor::from_vector(token, {static_cast<int64_t>(token.size())});
}

void moe_route_backward(Tensor& dlogits, const Tensor& dgate, const Tensor& logits,
                        const MoeRouting& r, const MoeRouteOptions& opt) {
  const char* op = "moe_route_backward";
  check_routing(op, r, logits);
  check_arg(op, "dlogits", dlogits, logits, logits.shape());
  check_arg(op, "dgate", dgate, logits, {r.N, r.K});
  cpu_only(op, logits);
  dispatch_cpu_float(logits, op, [&](auto tag) {
    using T = decltype(tag);
    cpu::moe_route_backward<T>(dlogits.data<T>(), dgate.data<T>(), logits.data<T>(),
                               r.expert.data<int32_t>(), r.N, r.E, opt);
  });
}

double moe_balance(const Tensor& logits, const MoeRouting& r, MoeRouter router) {
  const char* op = "moe_balance";
  check_routing(op, r, logits);
  cpu_only(op, logits);
  double out = 0;
  dispatch_cpu_float(logits, op, [&](auto tag) {
    using T = decltype(tag);
    out = cpu::moe_balance<T>(logits.data<T>(), r.load, r.N, r.E, r.K,
                              router == MoeRouter::Sigmoid);
  });
  return out;
}

void moe_balance_backward(Tensor& dlogits, const Tensor& logits, const MoeRouting& r,
                          MoeRouter router, double dscale) {
  const char* op = "moe_balance_backward";
  check_routing(op, r, logits);
  check_arg(op, "dlogits", dlogits, logits, logits.shape());
  cpu_only(op, logits);
  dispatch_cpu_float(logits, op, [&](auto tag) {
    using T = decltype(tag);
    cpu::moe_balance_backward<T>(dlogits.data<T>(), logits.data<T>(), r.load, r.N, r.E, r.K,
                                 router == MoeRouter::Sigmoid, dscale);
  });
}

void moe_permute(Tensor& x, const Tensor& u, const MoeRouting& r) {
  const char* op = "moe_permute";
  check_2d(op, "u", u);
  const int64_t d = u.dim(1);
  ATTNRES_CHECK(u.dim(0) == r.N, op, ": u has ", u.dim(0), " rows for ", r.N, " routed tokens");
  check_rows(op, "x", x, u, r.rows(), d);
  cpu_only(op, u);
  dispatch_cpu_float(u, op, [&](auto tag) {
    using T = decltype(tag);
    cpu::moe_permute<T>(x.data<T>(), u.data<T>(), r.token.data<int32_t>(), r.rows(), d);
  });
}

void moe_unpermute_add(Tensor& du, const Tensor& dx, const MoeRouting& r) {
  const char* op = "moe_unpermute_add";
  check_2d(op, "dx", dx);
  const int64_t d = dx.dim(1);
  check_rows(op, "dx", dx, dx, r.rows(), d);
  check_rows(op, "du", du, dx, r.N, d);
  cpu_only(op, dx);
  dispatch_cpu_float(dx, op, [&](auto tag) {
    using T = decltype(tag);
    cpu::moe_unpermute_add<T>(du.data<T>(), dx.data<T>(), r.row.data<int32_t>(), r.N, r.K, d);
  });
}

void moe_combine(Tensor& out, const Tensor& y, const MoeRouting& r, const Tensor* base) {
  const char* op = "moe_combine";
  check_2d(op, "y", y);
  const int64_t d = y.dim(1);
  check_rows(op, "y", y, y, r.rows(), d);
  check_rows(op, "out", out, y, r.N, d);
  if (base) check_rows(op, "base", *base, y, r.N, d);
  check_arg(op, "gate", r.gate, y, {r.N, r.K});
  cpu_only(op, y);
  dispatch_cpu_float(y, op, [&](auto tag) {
    using T = decltype(tag);
    cpu::moe_combine<T>(out.data<T>(), y.data<T>(), r.gate.data<T>(), r.row.data<int32_t>(),
                        base ? base->data<T>() : nullptr, r.N, r.K, d);
  });
}

void moe_combine_backward(Tensor& dy, Tensor& dgate, const Tensor& dout, const Tensor& y,
                          const MoeRouting& r) {
  const char* op = "moe_combine_backward";
  check_2d(op, "y", y);
  const int64_t d = y.dim(1);
  check_rows(op, "y", y, y, r.rows(), d);
  check_rows(op, "dy", dy, y, r.rows(), d);
  check_rows(op, "dout", dout, y, r.N, d);
  check_arg(op, "dgate", dgate, y, {r.N, r.K});
  check_arg(op, "gate", r.gate, y, {r.N, r.K});
  cpu_only(op, y);
  dispatch_cpu_float(y, op, [&](auto tag) {
    using T = decltype(tag);
    cpu::moe_combine_backward<T>(dy.data<T>(), dgate.data<T>(), dout.data<T>(), y.data<T>(),
                                 r.gate.data<T>(), r.row.data<int32_t>(), r.N, r.K, d);
  });
}

}  // namespace attnres::kernels
