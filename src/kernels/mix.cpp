// AttnRes depth Mix dispatcher: argument checks and dtype dispatch.
#include "kernels/mix.h"

#include <string>
#include <utility>
#include <vector>

#include "kernels/common.h"
#include "kernels/dispatch.h"
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
template <typename T>
std::vector<T*> mut_ptrs(Span<Tensor> ts) {
  std::vector<T*> p;
  for (Tensor& t : ts) p.push_back(t.data<T>());
  return p;
}

// Store::Set writes every gradient of the list: two entries that are one
// tensor would each overwrite the other's contribution.
void check_distinct_for_set(const char* op, const char* name, Span<Tensor> grads, Store store) {
  if (store != Store::Set) return;
  for (size_t j = 0; j < grads.size(); ++j)
    for (size_t i = 0; i < j; ++i)
      if (grads[i].raw() == grads[j].raw())
        fail(op, ": ", name, "[", i, "] and ", name, "[", j,
             "] are one tensor, which Store::Set cannot write (use Store::Add)");
}

// The CPU kernels accumulate; Store::Set is "zero, then add" there (the same
// numbers: x + 0 == x), a pass the CUDA kernels skip.
void zero_for_set(Span<Tensor> grads, Store store) {
  if (store != Store::Set) return;
  for (Tensor& g : grads) g.zero_();
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

void mix_forward(Span<Tensor> outs, Tensor& probs, Tensor* lse, Span<const Tensor> ws,
                 Span<const Tensor> sources, Span<const Tensor> rstds) {
  const char* op = "mix_forward";
  if (ws.empty()) fail(op, ": needs at least one query");
  if (outs.size() != ws.size()) fail(op, ": ", ws.size(), " queries but ", outs.size(), " outputs");
  // (Not a structured binding: C++17 lambdas cannot capture those.)
  const std::pair<int64_t, int64_t> Nd = check_sources(op, ws[0], sources, rstds);
  const int64_t N = Nd.first, d = Nd.second;
  const int64_t k = static_cast<int64_t>(sources.size()), Q = static_cast<int64_t>(ws.size());
  for (size_t i = 0; i < ws.size(); ++i) {
    check_arg(op, indexed("ws", i).c_str(), ws[i], ws[0], {d});
    check_arg(op, indexed("outs", i).c_str(), outs[i], ws[0], {N, d});
  }
  const DType sdt = stat_dtype(ws[0].dtype());
  check_arg(op, "probs", probs, ws[0].device(), sdt, {Q, N, k});
  if (lse) check_arg(op, "lse", *lse, ws[0].device(), sdt, {Q, N});
  ATTNRES_CUDA_DISPATCH(ws[0], op, cuda::mix_forward(outs, probs, lse, ws, sources, rstds));
  dispatch_cpu_float(ws[0], op, [&](auto tag) {
    using T = decltype(tag);
    const std::vector<const T*> src = const_ptrs<T>(sources), rs = const_ptrs<T>(rstds),
                                wp = const_ptrs<T>(ws);
    const std::vector<T*> out = mut_ptrs<T>(outs);
    cpu::mix_forward<T>(out.data(), probs.data<T>(), lse ? lse->data<T>() : nullptr, wp.data(), Q,
                        src.data(), rs.data(), N, d, k);
  });
}

void mix_backward(Span<Tensor> dsources, Span<Tensor> dws, Span<const Tensor> douts,
                  const Tensor* dlse, Span<const Tensor> ws, Span<const Tensor> sources,
                  Span<const Tensor> rstds, const Tensor& probs, Store store) {
  const char* op = "mix_backward";
  if (ws.empty()) fail(op, ": needs at least one query");
  if (dws.size() != ws.size() || douts.size() != ws.size())
    fail(op, ": ", ws.size(), " queries but ", dws.size(), " dws and ", douts.size(), " douts");
  const std::pair<int64_t, int64_t> Nd = check_sources(op, ws[0], sources, rstds);
  const int64_t N = Nd.first, d = Nd.second;
  const int64_t k = static_cast<int64_t>(sources.size()), Q = static_cast<int64_t>(ws.size());
  if (dsources.size() != sources.size())
    fail(op, ": ", sources.size(), " sources but ", dsources.size(), " dsources");
  for (size_t j = 0; j < dsources.size(); ++j)
    check_arg(op, indexed("dsources", j).c_str(), dsources[j], ws[0], {N, d});
  const DType gdt = grad_dtype(ws[0].dtype()), sdt = stat_dtype(ws[0].dtype());
  for (size_t i = 0; i < ws.size(); ++i) {
    check_arg(op, indexed("ws", i).c_str(), ws[i], ws[0], {d});
    check_arg(op, indexed("dws", i).c_str(), dws[i], ws[0].device(), gdt, {d});
    check_arg(op, indexed("douts", i).c_str(), douts[i], ws[0], {N, d});
  }
  check_arg(op, "probs", probs, ws[0].device(), sdt, {Q, N, k});
  if (dlse) check_arg(op, "dlse", *dlse, ws[0].device(), sdt, {Q, N});
  check_distinct_for_set(op, "dsources", dsources, store);
  ATTNRES_CUDA_DISPATCH(ws[0], op,
                        cuda::mix_backward(dsources, dws, douts, dlse, ws, sources, rstds, probs,
                                           store));
  zero_for_set(dsources, store);
  dispatch_cpu_float(ws[0], op, [&](auto tag) {
    using T = decltype(tag);
    const std::vector<const T*> src = const_ptrs<T>(sources), rs = const_ptrs<T>(rstds),
                                wp = const_ptrs<T>(ws), dy = const_ptrs<T>(douts);
    const std::vector<T*> dsrc = mut_ptrs<T>(dsources), dw = mut_ptrs<T>(dws);
    cpu::mix_backward<T>(dsrc.data(), dw.data(), dy.data(), dlse ? dlse->data<T>() : nullptr,
                         wp.data(), Q, src.data(), rs.data(), probs.data<T>(), N, d, k);
  });
}

// One query: the Q = 1 case with probs viewed as [1, N, k]. probs (and dw) are
// checked here although the Span overload checks them again, so that an error
// names what the caller passed: probs [N, k], not [1, N, k]; dw, not dws[0].
void mix_forward(Tensor& out, Tensor& probs, const Tensor& w, Span<const Tensor> sources,
                 Span<const Tensor> rstds) {
  const int64_t N = check_sources("mix_forward", w, sources, rstds).first;
  check_arg("mix_forward", "probs", probs, w.device(), stat_dtype(w.dtype()),
            {N, static_cast<int64_t>(sources.size())});
  Tensor p3 = probs.reshape({1, probs.dim(0), probs.dim(1)});
  mix_forward(Span<Tensor>(&out, 1), p3, nullptr, Span<const Tensor>(&w, 1), sources, rstds);
}

void mix_backward(Span<Tensor> dsources, Tensor& dw, const Tensor& dout, const Tensor& w,
                  Span<const Tensor> sources, Span<const Tensor> rstds, const Tensor& probs,
                  Store store) {
  const int64_t N = check_sources("mix_backward", w, sources, rstds).first;
  check_arg("mix_backward", "probs", probs, w.device(), stat_dtype(w.dtype()),
            {N, static_cast<int64_t>(sources.size())});
  check_arg("mix_backward", "dw", dw, w.device(), grad_dtype(w.dtype()), {w.dim(0)});
  mix_backward(dsources, Span<Tensor>(&dw, 1), Span<const Tensor>(&dout, 1), nullptr,
               Span<const Tensor>(&w, 1), sources, rstds,
               probs.reshape({1, probs.dim(0), probs.dim(1)}), store);
}

namespace {
// Checks the merge's common arguments: w and gain [d], o and the m >= 1
// recent sources [N, d], stats [N, 2m + 2]; returns {N, d}.
std::pair<int64_t, int64_t> check_merge(const char* op, const Tensor& w, const Tensor& o,
                                        Span<const Tensor> recent, const Tensor& gain,
                                        const Tensor& stats) {
  if (!w.defined() || w.ndim() != 1) fail(op, ": w must be 1-D [d]");
  check_2d(op, "o", o);
  const int64_t N = o.dim(0), d = w.dim(0);
  check_arg(op, "o", o, w, {N, d});
  if (recent.empty()) fail(op, ": needs at least one recent source");
  for (size_t j = 0; j < recent.size(); ++j)
    check_arg(op, indexed("recent", j).c_str(), recent[j], w, {N, d});
  check_arg(op, "gain", gain, w, {d});
  const int64_t m = static_cast<int64_t>(recent.size());
  check_arg(op, "stats", stats, w.device(), stat_dtype(w.dtype()), {N, 2 * m + 2});
  return {N, d};
}
}  // namespace

void mix_merge_norm_forward(Tensor& u, Tensor& stats, const Tensor& w, const Tensor& o,
                            const Tensor& lse, Span<const Tensor> recent, const Tensor& gain,
                            float eps) {
  const char* op = "mix_merge_norm_forward";
  const std::pair<int64_t, int64_t> Nd = check_merge(op, w, o, recent, gain, stats);
  const int64_t N = Nd.first, d = Nd.second, m = static_cast<int64_t>(recent.size());
  check_arg(op, "u", u, w, {N, d});
  check_arg(op, "lse", lse, w.device(), stat_dtype(w.dtype()), {N});
  if (!(eps >= 0)) fail(op, ": eps must be >= 0, got ", eps);
  ATTNRES_CUDA_DISPATCH(w, op,
                        cuda::mix_merge_norm_forward(u, stats, w, o, lse, recent, gain, eps));
  dispatch_cpu_float(w, op, [&](auto tag) {
    using T = decltype(tag);
    const std::vector<const T*> e = const_ptrs<T>(recent);
    cpu::mix_merge_norm_forward<T>(u.data<T>(), stats.data<T>(), w.data<T>(), o.data<T>(),
                                   lse.data<T>(), e.data(), m, gain.data<T>(), N, d,
                                   static_cast<T>(eps));
  });
}

void mix_merge_norm_backward(Tensor& d_o, Tensor& dlse, Span<Tensor> drecent, Tensor& dw,
                             Tensor& dgain, const Tensor& du, const Tensor& w, const Tensor& o,
                             Span<const Tensor> recent, const Tensor& gain, const Tensor& stats,
                             Store drecent_store) {
  const char* op = "mix_merge_norm_backward";
  const std::pair<int64_t, int64_t> Nd = check_merge(op, w, o, recent, gain, stats);
  const int64_t N = Nd.first, d = Nd.second, m = static_cast<int64_t>(recent.size());
  check_arg(op, "d_o", d_o, w, {N, d});
  if (drecent.size() != recent.size())
    fail(op, ": ", recent.size(), " recent sources but ", drecent.size(), " gradients");
  for (size_t j = 0; j < drecent.size(); ++j)
    check_arg(op, indexed("drecent", j).c_str(), drecent[j], w, {N, d});
  check_arg(op, "du", du, w, {N, d});
  check_arg(op, "dlse", dlse, w.device(), stat_dtype(w.dtype()), {N});
  check_arg(op, "dw", dw, w.device(), grad_dtype(w.dtype()), {d});
  check_arg(op, "dgain", dgain, w.device(), grad_dtype(w.dtype()), {d});
  check_distinct_for_set(op, "drecent", drecent, drecent_store);
  ATTNRES_CUDA_DISPATCH(w, op,
                        cuda::mix_merge_norm_backward(d_o, dlse, drecent, dw, dgain, du, w, o,
                                                      recent, gain, stats, drecent_store));
  zero_for_set(drecent, drecent_store);
  dispatch_cpu_float(w, op, [&](auto tag) {
    using T = decltype(tag);
    const std::vector<const T*> e = const_ptrs<T>(recent);
    const std::vector<T*> de = mut_ptrs<T>(drecent);
    cpu::mix_merge_norm_backward<T>(d_o.data<T>(), dlse.data<T>(), de.data(), dw.data<T>(),
                                    dgain.data<T>(), du.data<T>(), w.data<T>(), o.data<T>(),
                                    e.data(), m, gain.data<T>(), stats.data<T>(), N, d);
  });
}

}  // namespace attnres::kernels
