// AttnRes depth Mix dispatcher: argument checks and dtype dispatch.
#include "kernels/mix.h"

#include <string>
#include <utility>
#include <vector>

#include "kernels/common.h"
#include "kernels/cpu/mix.h"
#if ATTNRES_HAVE_CUDA
#include "kernels/cuda/mix.h"
#endif

namespace attnres::kernels {

namespace {

std::string indexed(const char* name, size_t j) { return std::string(name) + "[" + std::to_string(j) + "]"; }

// Validates w [d], k >= 1 sources [N, d] and k rstds [N] against w; returns
// {N, d}.
std::pair<int64_t, int64_t> check_sources(const char* op, const Tensor& w,
                                          Span<const Tensor> sources, Span<const Tensor> rstds) {
  if (!w.defined()) fail(op, ": w is undefined");
  if (w.ndim() != 1) fail(op, ": w must be 1-D [d], got ", shape_str(w.shape()));
  if (sources.empty()) fail(op, ": needs at least one source");
  if (rstds.size() != sources.size())
    fail(op, ": ", sources.size(), " sources but ", rstds.size(), " rstds");
  const int64_t d = w.dim(0);
  if (!sources[0].defined() || sources[0].ndim() != 2)
    fail(op, ": sources[0] must be 2-D [N, d], got ",
         sources[0].defined() ? shape_str(sources[0].shape()) : std::string("undefined"));
  const int64_t N = sources[0].dim(0);
  for (size_t j = 0; j < sources.size(); ++j) {
    check_arg(op, indexed("sources", j).c_str(), sources[j], w, {N, d});
    check_arg(op, indexed("rstds", j).c_str(), rstds[j], w.device(), stat_dtype(w.dtype()), {N});
  }
  return {N, d};
}

template <typename T>
std::vector<const T*> const_ptrs(Span<const Tensor> ts) {
  std::vector<const T*> p;
  for (const Tensor& t : ts) p.push_back(t.data<T>());
  return p;
}

}  // namespace

void mix_source_rstd(Tensor& rstd, const Tensor& v, float eps) {
  const char* op = "mix_source_rstd";
  if (!v.defined() || v.ndim() != 2)
    fail(op, ": v must be 2-D [N, d], got ",
         v.defined() ? shape_str(v.shape()) : std::string("undefined"));
  const int64_t N = v.dim(0), d = v.dim(1);
  check_arg(op, "rstd", rstd, v.device(), stat_dtype(v.dtype()), {N});
  if (!(eps >= 0)) fail(op, ": eps must be >= 0, got ", eps);
  ATTNRES_CUDA_DISPATCH(v, op, cuda::mix_source_rstd(rstd, v, eps));
  dispatch_cpu_float(v, op, [&](auto tag) {
    using T = decltype(tag);
    cpu::mix_source_rstd<T>(rstd.data<T>(), v.data<T>(), N, d, static_cast<T>(eps));
  });
}

void mix_forward(Tensor& out, Tensor& probs, const Tensor& w, Span<const Tensor> sources,
                 Span<const Tensor> rstds) {
  const char* op = "mix_forward";
  // (Not a structured binding: C++17 lambdas cannot capture those.)
  const std::pair<int64_t, int64_t> Nd = check_sources(op, w, sources, rstds);
  const int64_t N = Nd.first, d = Nd.second;
  const int64_t k = static_cast<int64_t>(sources.size());
  check_arg(op, "out", out, w, {N, d});
  check_arg(op, "probs", probs, w.device(), stat_dtype(w.dtype()), {N, k});
  ATTNRES_CUDA_DISPATCH(w, op, cuda::mix_forward(out, probs, w, sources, rstds));
  dispatch_cpu_float(w, op, [&](auto tag) {
    using T = decltype(tag);
    const std::vector<const T*> src = const_ptrs<T>(sources), rs = const_ptrs<T>(rstds);
    cpu::mix_forward<T>(out.data<T>(), probs.data<T>(), w.data<T>(), src.data(), rs.data(), N, d,
                        k);
  });
}

void mix_backward(Span<Tensor> dsources, Tensor& dw, const Tensor& dout, const Tensor& w,
                  Span<const Tensor> sources, Span<const Tensor> rstds, const Tensor& probs) {
  const char* op = "mix_backward";
  const std::pair<int64_t, int64_t> Nd = check_sources(op, w, sources, rstds);
  const int64_t N = Nd.first, d = Nd.second;
  const int64_t k = static_cast<int64_t>(sources.size());
  if (dsources.size() != sources.size())
    fail(op, ": ", sources.size(), " sources but ", dsources.size(), " dsources");
  for (size_t j = 0; j < dsources.size(); ++j)
    check_arg(op, indexed("dsources", j).c_str(), dsources[j], w, {N, d});
  check_arg(op, "dw", dw, w.device(), grad_dtype(w.dtype()), {d});
  check_arg(op, "dout", dout, w, {N, d});
  check_arg(op, "probs", probs, w.device(), stat_dtype(w.dtype()), {N, k});
  ATTNRES_CUDA_DISPATCH(w, op, cuda::mix_backward(dsources, dw, dout, w, sources, rstds, probs));
  dispatch_cpu_float(w, op, [&](auto tag) {
    using T = decltype(tag);
    const std::vector<const T*> src = const_ptrs<T>(sources), rs = const_ptrs<T>(rstds);
    std::vector<T*> dsrc;
    for (Tensor& t : dsources) dsrc.push_back(t.data<T>());
    cpu::mix_backward<T>(dsrc.data(), dw.data<T>(), dout.data<T>(), w.data<T>(), src.data(),
                         rs.data(), probs.data<T>(), N, d, k);
  });
}

}  // namespace attnres::kernels
