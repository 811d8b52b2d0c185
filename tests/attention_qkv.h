// Attention on separate q, k and v tensors, for tests that build them apart:
// the op takes them as the column blocks of one joint tensor qkv (q | k | v,
// kernels/attention.h), so these pack them into one, call the op, and split
// the gradients back. The joint tensor's other blocks are what the op reads
// beside each block, so every call also checks that the op keeps to the
// joint row stride.
#pragma once
#include <cstring>
#include <vector>

#include "core/tensor.h"
#include "kernels/attention.h"

namespace attnres::testing {

// Tensors of `rows` rows side by side: [rows, sum of their columns], on the
// first one's device, any dtype (the bytes are copied).
inline Tensor join_cols(const std::vector<Tensor>& parts) {
  const Tensor& first = parts.at(0);
  const int64_t rows = first.dim(0);
  const size_t es = dtype_size(first.dtype());
  int64_t width = 0;
  std::vector<Tensor> host;
  for (const Tensor& p : parts) {
    ATTNRES_CHECK(p.ndim() == 2 && p.dim(0) == rows && p.dtype() == first.dtype(),
                  "join_cols: ", p.describe(), " beside ", first.describe());
    host.push_back(p.to(Device::CPU));
    width += p.dim(1);
  }
  Tensor all = Tensor::empty({rows, width}, first.dtype());
  auto* dst = static_cast<char*>(all.raw());
  for (int64_t r = 0; r < rows; ++r)
    for (const Tensor& p : host) {
      const size_t n = static_cast<size_t>(p.dim(1)) * es;
      std::memcpy(dst, static_cast<const char*>(p.raw()) + r * n, n);
      dst += n;
    }
  return all.to(first.device());
}

// The inverse: copies the column blocks of `all` into `parts` (their shapes
// say the widths), on their devices.
inline void split_cols(const Tensor& all, const std::vector<Tensor*>& parts) {
  const Tensor host = all.to(Device::CPU);
  const size_t es = dtype_size(all.dtype());
  const int64_t rows = all.dim(0);
  const auto* src = static_cast<const char*>(host.raw());
  std::vector<Tensor> out;
  int64_t width = 0;
  for (Tensor* p : parts) {
    out.push_back(Tensor::empty(p->shape(), p->dtype()));
    width += p->dim(1);
  }
  ATTNRES_CHECK(width == all.dim(1), "split_cols: ", width, " columns from ", all.describe());
  for (int64_t r = 0; r < rows; ++r)
    for (Tensor& o : out) {
      const size_t n = static_cast<size_t>(o.dim(1)) * es;
      std::memcpy(static_cast<char*>(o.raw()) + r * n, src, n);
      src += n;
    }
  for (size_t i = 0; i < parts.size(); ++i) parts[i]->copy_from(out[i]);
}

inline void attention_forward(Tensor& out, Tensor& lse, const Tensor& q, const Tensor& k,
                              const Tensor& v, const kernels::AttnShape& s,
                              kernels::AttentionKernel kernel = kernels::AttentionKernel::Own) {
  kernels::attention_forward(out, lse, join_cols({q, k, v}), s, kernel);
}

// dq, dk, dv as the op leaves them (Add: += gradients; Set: = gradients).
inline void attention_backward(Tensor& dq, Tensor& dk, Tensor& dv, const Tensor& dout,
                               const Tensor& q, const Tensor& k, const Tensor& v,
                               const Tensor& out, const Tensor& lse, const kernels::AttnShape& s,
                               kernels::Store store = kernels::Store::Add,
                               kernels::AttentionKernel kernel = kernels::AttentionKernel::Own) {
  Tensor dqkv = join_cols({dq, dk, dv});
  kernels::attention_backward(dqkv, dout, join_cols({q, k, v}), out, lse, s, store, kernel);
  split_cols(dqkv, {&dq, &dk, &dv});
}

}  // namespace attnres::testing
