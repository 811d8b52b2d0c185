// Mixture-of-experts dispatcher: argument checks and dtype dispatch.
#include "kernels/moe.h"

#include "kernels/common.h"
#include "kernels/cpu/moe.h"
#include "kernels/dispatch.h"
#if ATTNRES_HAVE_CUDA
#include "kernels/cuda/moe.h"
#endif

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

// The capacity and the permutation, from the choice expert [N, K] (host
// memory; the same code for both backends): who is dropped depends on the
// order of the slots, so one pass in token order decides it. row [N, K]
// (host): a slot's row among the M kept, -1 when dropped; r's token,
// offsets, load and dropped.
void assign_rows(const int32_t* expert, int64_t capacity, int32_t* row, std::vector<int32_t>& token,
                 MoeRouting& r) {
  const int64_t N = r.N, K = r.K, E = r.E;
  r.load.assign(static_cast<size_t>(E), 0);
  std::vector<int64_t> kept(static_cast<size_t>(E), 0);
  r.dropped = 0;
  for (int64_t i = 0; i < N * K; ++i) {
    const int32_t e = expert[i];
    ++r.load[e];
    if (capacity > 0 && kept[e] >= capacity) {
      row[i] = -1;
      ++r.dropped;
    } else {
      row[i] = static_cast<int32_t>(kept[e]++);  // its index within e, for now
    }
  }
  r.offsets.assign(static_cast<size_t>(E + 1), 0);
  for (int64_t e = 0; e < E; ++e) r.offsets[e + 1] = r.offsets[e] + kept[e];
  token.assign(static_cast<size_t>(r.offsets[E]), 0);
  for (int64_t i = 0; i < N * K; ++i) {
    if (row[i] < 0) continue;
    row[i] = static_cast<int32_t>(r.offsets[expert[i]] + row[i]);
    token[row[i]] = static_cast<int32_t>(i / K);
  }
}

// The gate weights are in the statistics' dtype (the logits'); the rows in
// the activations' (the same on the CPU, bf16 or F32 on CUDA).
void check_gate(const char* op, const MoeRouting& r, const Tensor& rows) {
  ATTNRES_CHECK(r.gate.defined() && r.gate.dim(0) == r.N && r.gate.dim(1) == r.K &&
                    r.gate.device() == rows.device(),
                op, ": the routing's gate weights ", r.gate.describe(), " do not go with ",
                rows.describe());
  if (!rows.is_cuda())
    ATTNRES_CHECK(r.gate.dtype() == rows.dtype(), op, ": gate weights ",
                  dtype_name(r.gate.dtype()), " with ", dtype_name(rows.dtype()), " rows");
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
  r = MoeRouting{};
  r.N = N;
  r.E = E;
  r.K = K;
  r.expert = Tensor::empty({N, K}, DType::I32, logits.device());
  r.gate = Tensor::empty({N, K}, logits.dtype(), logits.device());
  std::vector<int32_t> token;
  if (logits.is_cuda()) {
#if ATTNRES_HAVE_CUDA
    // The choice on the GPU; the expert ids to the host for the capacity
    // and the permutation (the expert GEMMs' sizes are needed there anyway).
    cuda::moe_choose(r.expert, r.gate, logits, bias, opt);
    const Tensor expert = r.expert.to(Device::CPU);
    Tensor row = Tensor::empty({N, K}, DType::I32);
    assign_rows(expert.data<int32_t>(), opt.capacity, row.data<int32_t>(), token, r);
    r.row = row.to(Device::CUDA);
    r.token = Tensor::from_vector(token, {static_cast<int64_t>(token.size())}).to(Device::CUDA);
    if (r.dropped > 0) cuda::moe_zero_dropped(r.gate, r.row);
    return;
#else
    fail_no_cuda(op);
#endif
  }
  r.row = Tensor::empty({N, K}, DType::I32);
  dispatch_cpu_float(logits, op, [&](auto tag) {
    using T = decltype(tag);
    cpu::moe_choose<T>(logits.data<T>(), bias ? bias->data<T>() : nullptr, N, E, opt,
                       r.expert.data<int32_t>(), r.gate.data<T>());
    assign_rows(r.expert.data<int32_t>(), opt.capacity, r.row.data<int32_t>(), token, r);
    for (int64_t i = 0; i < N * K; ++i)  // a dropped slot adds nothing
      if (r.row.data<int32_t>()[i] < 0) r.gate.data<T>()[i] = T(0);
  });
  r.token = Tensor::from_vector(token, {static_cast<int64_t>(token.size())});
}

void moe_route_backward(Tensor& dlogits, const Tensor& dgate, const Tensor& logits,
                        const MoeRouting& r, const MoeRouteOptions& opt) {
  const char* op = "moe_route_backward";
  check_routing(op, r, logits);
  check_arg(op, "dlogits", dlogits, logits, logits.shape());
  check_arg(op, "dgate", dgate, logits, {r.N, r.K});
  ATTNRES_CUDA_DISPATCH(logits, op, cuda::moe_route_backward(dlogits, dgate, logits, r, opt));
  dispatch_cpu_float(logits, op, [&](auto tag) {
    using T = decltype(tag);
    cpu::moe_route_backward<T>(dlogits.data<T>(), dgate.data<T>(), logits.data<T>(),
                               r.expert.data<int32_t>(), r.N, r.E, opt);
  });
}

double moe_balance(const Tensor& logits, const MoeRouting& r, MoeRouter router) {
  const char* op = "moe_balance";
  check_routing(op, r, logits);
  ATTNRES_CUDA_DISPATCH(logits, op, cuda::moe_balance(logits, r, router));
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
  ATTNRES_CUDA_DISPATCH(logits, op, cuda::moe_balance_backward(dlogits, logits, r, router, dscale));
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
  ATTNRES_CUDA_DISPATCH(u, op, cuda::moe_permute(x, u, r));
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
  ATTNRES_CUDA_DISPATCH(dx, op, cuda::moe_unpermute_add(du, dx, r));
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
  check_gate(op, r, y);
  ATTNRES_CUDA_DISPATCH(y, op, cuda::moe_combine(out, y, r, base));
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
  check_gate(op, r, y);
  check_arg(op, "dgate", dgate, r.gate, {r.N, r.K});
  ATTNRES_CUDA_DISPATCH(y, op, cuda::moe_combine_backward(dy, dgate, dout, y, r));
  dispatch_cpu_float(y, op, [&](auto tag) {
    using T = decltype(tag);
    cpu::moe_combine_backward<T>(dy.data<T>(), dgate.data<T>(), dout.data<T>(), y.data<T>(),
                                 r.gate.data<T>(), r.row.data<int32_t>(), r.N, r.K, d);
  });
}

}  // namespace attnres::kernels
