// Per-token log-probabilities of selected positions: what `attnres score`
// prints and what multiple-choice evaluation sums over an answer's tokens.
// The training loss never needs them (the fused LM head + cross-entropy of
// kernels/cross_entropy.h sums them on the device); scoring needs them one
// by one, for a few positions of each sequence.
#include <algorithm>
#include <cmath>

#include "kernels/embedding.h"
#include "kernels/matmul.h"
#include "kernels/reduce.h"
#include "model/model.h"

namespace attnres::model {

namespace kern = attnres::kernels;

namespace {
// Logit rows per GEMM: bounds the [rows, V] fp32 block to about 64 MiB.
int64_t logit_rows_per_pass(int64_t V) { return std::max<int64_t>(1, (int64_t{1} << 24) / V); }

// t itself when it has `dtype`, else a converted copy on t's device.
Tensor in_dtype(const Tensor& t, DType dtype) {
  if (t.dtype() == dtype) return t;
  Tensor out = Tensor::empty(t.shape(), dtype, t.device());
  kern::convert(out, t);
  return out;
}
}  // namespace

std::vector<double> Model::head_logprobs(const DepthState& st, const std::vector<int64_t>& rows,
                                         const std::vector<int32_t>& targets,
                                         Activations& acts) const {
  ATTNRES_CHECK(w_.final_norm && w_.lm_head, "head_logprobs on a model part without the head");
  ATTNRES_CHECK(rows.size() == targets.size(), rows.size(), " rows for ", targets.size(),
                " targets");
  const int64_t n = static_cast<int64_t>(rows.size()), V = cfg_.vocab_size, d = cfg_.d_model;
  std::vector<double> out(rows.size());
  if (n == 0) return out;
  const Tensor h = final_norm(st, acts);  // [N, d], N = B*T
  const int64_t N = h.dim(0);
  std::vector<int32_t> idx(rows.size());
  for (int64_t i = 0; i < n; ++i) {
    ATTNRES_CHECK(rows[i] >= 0 && rows[i] < N, "row ", rows[i], " outside the batch of ", N);
    if (targets[i] < 0 || targets[i] >= V)
      fail("token id ", targets[i], " is outside the model's vocabulary [0, ", V, ")");
    idx[i] = static_cast<int32_t>(rows[i]);
  }
  // The selected rows of h (a row gather is an embedding lookup with h as
  // the table), and the output weights the training loss computes with
  // (`value`: bf16 in a bf16 run, widened to fp32 for this pass), so the
  // logits are fp32 in every run and do not depend on whether ZeRO-1 sliced
  // the fp32 masters away (Optimizer::take_master_slices).
  const Tensor& w = w_.lm_head->value;
  const Tensor w_out = in_dtype(w, w.dtype() == DType::BF16 ? DType::F32 : w.dtype());
  Tensor rows_of_h = new_act(n, d);
  kern::embedding_forward(rows_of_h, h, on_device(Tensor::from_vector(idx, {n})));
  const Tensor picked = in_dtype(rows_of_h, w_out.dtype());
  const int64_t chunk = logit_rows_per_pass(V);
  for (int64_t r0 = 0; r0 < n; r0 += chunk) {
    const int64_t m = std::min(chunk, n - r0);
    Tensor logits = Tensor::empty({m, V}, w_out.dtype(), device_);
    kern::matmul_forward(logits, picked.rows(r0, m), w_out);
    const Tensor host = logits.to(Device::CPU);
    auto row_logprob = [&](const auto* z, int32_t t) {
      double mx = z[0];
      for (int64_t v = 1; v < V; ++v) mx = std::max(mx, static_cast<double>(z[v]));
      double sum = 0;
      for (int64_t v = 0; v < V; ++v) sum += std::exp(static_cast<double>(z[v]) - mx);
      return static_cast<double>(z[t]) - mx - std::log(sum);
    };
    // Rows are independent (each one's sums run in a fixed order): threads
    // change the speed, not the bits. On a GPU run this host pass is most of
    // a scoring pass's time at a large vocabulary.
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < m; ++i) {
      const int32_t t = targets[static_cast<size_t>(r0 + i)];
      out[static_cast<size_t>(r0 + i)] =
          host.dtype() == DType::F64 ? row_logprob(host.data<double>() + i * V, t)
                                     : row_logprob(host.data<float>() + i * V, t);
    }
  }
  return out;
}

std::vector<double> Model::forward_logprobs(const Tensor& tokens, int64_t B, int64_t T,
                                            const std::vector<int64_t>& rows,
                                            const std::vector<int32_t>& targets) const {
  DepthState st;
  Activations acts;
  embed_forward(tokens, B, T, st, acts);
  layers_forward(0, cfg_.n_layers, st, acts);
  acts.sub.clear();  // nothing runs backward: free the layers' records before the head
  return head_logprobs(st, rows, targets, acts);
}

}  // namespace attnres::model
