#include "parallel/step_graph.h"

#include <cstring>

#include "core/error.h"

namespace attnres::parallel {

StepGraph::StepGraph(int64_t B, int64_t T, size_t deferred_per_microbatch, bool reads_data)
    : B_(B),
      T_(T),
      deferred_per_microbatch_(deferred_per_microbatch),
      reads_data_(reads_data),
      clock_(std::make_unique<cuda::StreamClock>()) {}
StepGraph::~StepGraph() = default;

void StepGraph::stage(int M, const DataFn& data) {
  const int64_t N = B_ * T_, all = int64_t(M) * N;
  if (!staged_.defined() || staged_.numel() != 2 * all) {
    staged_ = Tensor::empty({2 * all}, DType::I32, Device::CUDA);
    pinned_ = std::make_unique<cuda::HostBuffer>(sizeof(int32_t) * 2 * all, /*pinned=*/true);
  }
  auto* host = static_cast<int32_t*>(pinned_->data());
  for (int mb = 0; mb < M; ++mb) {
    const data::TokenLoader::Batch b = data(mb);
    for (const auto& [t, at] :
         {std::make_pair(&b.inputs, int64_t(0)), std::make_pair(&b.targets, all)}) {
      ATTNRES_CHECK(t->is_cpu() && t->dtype() == DType::I32 && t->numel() == N,
                    "StepGraph: microbatch ", mb, " is not ", N, " int32 ids in host memory");
      std::memcpy(host + at + int64_t(mb) * N, t->raw(), sizeof(int32_t) * N);
    }
  }
  // The previous launch read staged_ before its results were collected, and
  // pinned_ is not touched again before this copy is (collect() waits).
  cuda::copy_async(staged_.raw(), cuda::Side::Device, host, cuda::Side::Host, pinned_->bytes());
}

StepStats StepGraph::run(int M, const DataFn& data,
                         const std::function<StepStats(const DataFn&, bool)>& step) {
  if (!warm_) {
    warm_ = true;
    return step(data, /*capturing=*/false);
  }
  if (reads_data_) stage(M, data);
  const int64_t N = B_ * T_;
  const size_t deferred = deferred_per_microbatch_ * size_t(M);
  if (!graph_ || M != M_) {
    graph_.reset();
    // The eager steps' activations stay cached in the pool; the graph's come
    // from its own.
    cuda::trim_memory_pool();
    checks_ = std::make_unique<cuda::DeferredChecks>(deferred);
    const DataFn staged = [&](int mb) {
      ATTNRES_CHECK(reads_data_, "StepGraph: the step of a rank without the first or last chunk "
                                 "read microbatch ", mb);
      return data::TokenLoader::Batch{staged_.rows(int64_t(mb) * N, N),
                                      staged_.rows(int64_t(M + mb) * N, N)};
    };
    auto graph = std::make_unique<cuda::StreamGraph>();
    try {
      const cuda::DeferScope scope(*checks_);
      graph->capture([&] { captured_ = step(staged, /*capturing=*/true); });
    } catch (const InternalError& e) {  // an op that cannot be captured (out of memory stays bad input)
      fail_internal("capturing the training step into a CUDA graph failed (training.cuda_graphs; "
                    "set it to false to train without graphs): ", e.what());
    }
    ATTNRES_CHECK(checks_->claimed() == deferred, "StepGraph: the captured step deferred ",
                  checks_->claimed(), " results, expected ", deferred);
    graph_ = std::move(graph);
    M_ = M;
  }
  clock_->reset();
  const int t0 = clock_->mark();
  graph_->launch();
  const int t1 = clock_->mark();
  ++launches_;
  StepStats st = captured_;
  st.loss_sum = 0;  // the executor's sum: microbatch order, from 0
  for (double loss : checks_->collect()) st.loss_sum += loss;
  st.wall_sec = st.busy_sec = clock_->seconds(t0, t1);
  return st;
}

}  // namespace attnres::parallel
