// Embedding dispatcher: argument checks, token-id validation, dtype dispatch.
#include "kernels/embedding.h"

#include "kernels/common.h"
#include "kernels/cpu/embedding.h"

namespace attnres::kernels {

namespace {

// `t` must be defined, live where `ref` lives, have `ref`'s dtype and `shape`.
void check_arg(const char* op, const char* name, const Tensor& t, const Tensor& ref,
               const Shape& shape) {
  if (!t.defined()) fail(op, ": ", name, " is undefined");
  if (t.device() != ref.device())
    fail(op, ": ", name, " is on ", device_name(t.device()), ", expected ", device_name(ref.device()));
  if (t.dtype() != ref.dtype())
    fail(op, ": ", name, " is ", dtype_name(t.dtype()), ", expected ", dtype_name(ref.dtype()));
  if (t.shape() != shape)
    fail(op, ": ", name, " has shape ", shape_str(t.shape()), ", expected ", shape_str(shape));
}

// tokens must be a host I32 vector of ids in [0, V). An out-of-range id would
// read or write outside the table, so we name the first offender.
void check_tokens(const char* op, const Tensor& tokens, int64_t V) {
  if (!tokens.defined()) fail(op, ": tokens is undefined");
  if (tokens.dtype() != DType::I32)
    fail(op, ": tokens must be I32, got ", dtype_name(tokens.dtype()));
  if (!tokens.is_cpu()) fail(op, ": tokens must be on the cpu");
  if (tokens.ndim() != 1) fail(op, ": tokens must be 1-D [N], got ", shape_str(tokens.shape()));
  const int32_t* ids = tokens.data<int32_t>();
  for (int64_t i = 0; i < tokens.numel(); ++i)
    if (ids[i] < 0 || ids[i] >= V)
      fail(op, ": token id ", ids[i], " at position ", i, " is outside the vocabulary [0, ", V, ")");
}

}  // namespace

void embedding_forward(Tensor& out, const Tensor& weight, const Tensor& tokens) {
  const char* op = "embedding_forward";
  if (!weight.defined() || weight.ndim() != 2)
    fail(op, ": weight must be 2-D [V, d], got ",
         weight.defined() ? shape_str(weight.shape()) : std::string("undefined"));
  const int64_t V = weight.dim(0), d = weight.dim(1);
  check_tokens(op, tokens, V);
  const int64_t N = tokens.numel();
  check_arg(op, "out", out, weight, {N, d});
  dispatch_cpu_float(weight, op, [&](auto tag) {
    using T = decltype(tag);
    cpu::embedding_forward<T>(out.data<T>(), weight.data<T>(), tokens.data<int32_t>(), N, d);
  });
}

void embedding_backward(Tensor& dweight, const Tensor& dout, const Tensor& tokens) {
  const char* op = "embedding_backward";
  if (!dweight.defined() || dweight.ndim() != 2)
    fail(op, ": dweight must be 2-D [V, d], got ",
         dweight.defined() ? shape_str(dweight.shape()) : std::string("undefined"));
  const int64_t V = dweight.dim(0), d = dweight.dim(1);
  check_tokens(op, tokens, V);
  const int64_t N = tokens.numel();
  check_arg(op, "dout", dout, dweight, {N, d});
  dispatch_cpu_float(dweight, op, [&](auto tag) {
    using T = decltype(tag);
    cpu::embedding_backward<T>(dweight.data<T>(), dout.data<T>(), tokens.data<int32_t>(), N, V, d);
  });
}

}  // namespace attnres::kernels
