// Residual-variant depth Mix dispatcher: argument checks and dtype dispatch.
#include "kernels/mix_variant.h"

#include <string>
#include <vector>

#include "kernels/common.h"
#include "kernels/cpu/mix_variant.h"
#include "kernels/dispatch.h"
#if ATTNRES_HAVE_CUDA
#include "kernels/cuda/mix_variant.h"
#endif

namespace attnres::kernels {

namespace {

// Checks the sources, the form and the query against them; returns {N, d, k}.
struct Dims {
  int64_t N, d, k;
};
Dims check(const char* op, const Tensor& query, Span<const Tensor> sources, const MixForm& f) {
  if (sources.empty()) fail(op, ": needs at least one source");
  const Tensor& s0 = sources[0];
  if (!s0.defined() || s0.ndim() != 2)
    fail(op, ": sources[0] must be 2-D [N, d], got ",
         s0.defined() ? shape_str(s0.shape()) : std::string("undefined"));
  const Dims dims{s0.dim(0), s0.dim(1), static_cast<int64_t>(sources.size())};
  for (size_t j = 0; j < sources.size(); ++j)
    check_arg(op, ("sources[" + std::to_string(j) + "]").c_str(), sources[j], s0, {dims.N, dims.d});
  if (f.heads < 1 || dims.d % f.heads != 0)
    fail(op, ": ", f.heads, " heads do not divide d = ", dims.d);
  const bool scalars = f.logits == MixLogits::Scalars || f.logits == MixLogits::Weights;
  if (scalars && f.heads != 1) fail(op, ": scalar weights have one head, got ", f.heads);
  const Shape qshape = f.logits == MixLogits::Query        ? Shape{dims.d}
                       : f.logits == MixLogits::RowQueries ? Shape{dims.N, dims.d}
                                                           : Shape{dims.k};
  check_arg(op, "query", query, s0, qshape);
  return dims;
}

}  // namespace

void mix_variant_forward(Tensor& out, Tensor& weights, const Tensor& query,
                         Span<const Tensor> sources, const MixForm& form, float eps) {
  const char* op = "mix_variant_forward";
  const Dims m = check(op, query, sources, form);
  check_arg(op, "out", out, sources[0], {m.N, m.d});
  check_arg(op, "weights", weights, sources[0].device(), stat_dtype(sources[0].dtype()),
            {m.N, form.heads, m.k});
  ATTNRES_CUDA_DISPATCH(sources[0], op, cuda::mix_variant_forward(out, weights, query, sources, form, eps));
  dispatch_cpu_float(sources[0], op, [&](auto tag) {
    using T = decltype(tag);
    std::vector<const T*> src;
    for (const Tensor& s : sources) src.push_back(s.data<T>());
    cpu::mix_variant_forward<T>(out.data<T>(), weights.data<T>(), query.data<T>(), src.data(),
                                m.N, m.d, m.k, form, static_cast<T>(eps));
  });
}

void mix_variant_backward(Span<Tensor> dsources, Tensor& dquery, const Tensor& dout,
                          const Tensor& query, Span<const Tensor> sources, const Tensor& weights,
                          const MixForm& form, float eps) {
  const char* op = "mix_variant_backward";
  const Dims m = check(op, query, sources, form);
  check_arg(op, "dout", dout, sources[0], {m.N, m.d});
  // A row query's gradient has the rows' dtype; a parameter's its gradient
  // dtype (fp32 for bf16 weights).
  const DType gdt = form.logits == MixLogits::RowQueries ? query.dtype() : grad_dtype(query.dtype());
  check_arg(op, "dquery", dquery, query.device(), gdt, query.shape());
  check_arg(op, "weights", weights, sources[0].device(), stat_dtype(sources[0].dtype()),
            {m.N, form.heads, m.k});
  if (dsources.size() != sources.size())
    fail(op, ": ", sources.size(), " sources but ", dsources.size(), " source gradients");
  for (size_t j = 0; j < dsources.size(); ++j)
    check_arg(op, ("dsources[" + std::to_string(j) + "]").c_str(), dsources[j], sources[0],
              {m.N, m.d});
  ATTNRES_CUDA_DISPATCH(sources[0], op,
                        cuda::mix_variant_backward(dsources, dquery, dout, query, sources, weights,
                                                   form, eps));
  dispatch_cpu_float(sources[0], op, [&](auto tag) {
    using T = decltype(tag);
    std::vector<const T*> src;
    std::vector<T*> dsrc;
    for (const Tensor& s : sources) src.push_back(s.data<T>());
    for (Tensor& s : dsources) dsrc.push_back(s.data<T>());
    cpu::mix_variant_backward<T>(dsrc.data(), dquery.data<T>(), dout.data<T>(), query.data<T>(),
                                 src.data(), weights.data<T>(), m.N, m.d, m.k, form,
                                 static_cast<T>(eps));
  });
}

}  // namespace attnres::kernels
