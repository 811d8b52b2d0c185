// Embedding dispatcher: argument checks, token-id validation, dtype dispatch.
#include "kernels/embedding.h"

#include "kernels/common.h"
#include "kernels/dispatch.h"
#include "kernels/cpu/embedding.h"
#if ATTNRES_HAVE_CUDA
#include "kernels/cuda/embedding.h"
#endif

namespace attnres::kernels {

namespace {

// tokens must be an I32 vector of ids in [0, V) on the table's device. An
// out-of-range id would read or write outside the table, so we name the first
// offender (the CUDA kernels check on the device and report the same way).
void check_tokens(const char* op, const Tensor& tokens, const Tensor& table) {
  const int64_t V = table.dim(0);
  if (!tokens.defined()) fail(op, ": tokens is undefined");
  if (tokens.dtype() != DType::I32)
    fail(op, ": tokens must be I32, got ", dtype_name(tokens.dtype()));
  if (tokens.device() != table.device())
    fail(op, ": tokens are on ", device_name(tokens.device()), ", the table on ",
         device_name(table.device()));
  if (tokens.ndim() != 1) fail(op, ": tokens must be 1-D [N], got ", shape_str(tokens.shape()));
  if (tokens.is_cuda()) return;
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
  const int64_t d = weight.dim(1);
  check_tokens(op, tokens, weight);
  const int64_t N = tokens.numel();
  check_arg(op, "out", out, weight, {N, d});
  ATTNRES_CUDA_DISPATCH(weight, op, cuda::embedding_forward(out, weight, tokens));
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
  check_tokens(op, tokens, dweight);
  const int64_t N = tokens.numel();
  // dweight is a parameter gradient: fp32 when the activations are bf16.
  if (!dout.defined()) fail(op, ": dout is undefined");
  if (grad_dtype(dout.dtype()) != dweight.dtype())
    fail(op, ": dweight is ", dtype_name(dweight.dtype()), ", expected ",
         dtype_name(grad_dtype(dout.dtype())), " for ", dtype_name(dout.dtype()), " dout");
  check_arg(op, "dout", dout, dweight.device(), dout.dtype(), {N, d});
  ATTNRES_CUDA_DISPATCH(dweight, op, cuda::embedding_backward(dweight, dout, tokens));
  dispatch_cpu_float(dweight, op, [&](auto tag) {
    using T = decltype(tag);
    cpu::embedding_backward<T>(dweight.data<T>(), dout.data<T>(), tokens.data<int32_t>(), N, V, d);
  });
}

}  // namespace attnres::kernels
