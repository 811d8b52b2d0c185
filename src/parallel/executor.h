// The pipeline executor: runs one rank's action list (parallel/schedule.h)
// with the rank's model chunks, moving depth states between ranks with the
// caching protocol of docs/parallel.md.
//
// Forward: a rank keeps, per in-flight microbatch, a store of the sources it
// holds (produced by its own chunks or received). The message into chunk c
// carries only the sources the receiving rank does not hold yet, plus the
// partial sum (parallel/layout.h, boundary_message); the naive protocol
// (parallel.cache_blocks = false) sends every source so far.
//
// Backward: the rank keeps a gradient accumulator per held source; its
// chunks' backward passes add into them (the model's Mix backward adds in
// place). The gradient message from chunk c to c-1 carries d(partial) and,
// for exactly the sources the forward message c-1 -> c carried, everything
// the sender accumulated for them (the sender then drops them); the
// receiver adds them to its own accumulators. A source's total gradient so
// flows back along the path the source travelled and is complete when the
// chunk that produced it runs its backward. Stores and accumulators of a
// microbatch are freed after its last backward on the rank.
#pragma once
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <vector>

#include "core/device.h"
#include "data/loader.h"
#include "model/model.h"
#include "parallel/layout.h"
#include "parallel/schedule.h"
#include "parallel/transport.h"

namespace attnres::parallel {

// The model chunks of one pipeline rank: local chunk v is global chunk
// v*P + stage, a Model holding only that chunk's layers, plus the embedding
// (chunk 0) or the final Mix, norm and LM head (chunk C-1; with tied
// embeddings it holds its own copy of the embedding matrix, whose gradient
// is summed with chunk 0's before every update so the copies stay identical).
class RankModel {
 public:
  // With expert parallelism (EP > 1), member `expert_rank` of its expert
  // group: its chunks hold routed experts [expert_rank E / EP, (expert_rank
  // + 1) E / EP) of each MoE layer.
  RankModel(const model::ModelConfig& cfg, DType dtype, Device device, const PipelineLayout& layout,
            int stage, int expert_rank = 0, int EP = 1);

  int size() const { return static_cast<int>(chunks_.size()); }
  model::Model& chunk(int v) { return *chunks_.at(static_cast<size_t>(v)); }
  int chunk_id(int v) const { return v * layout_.P() + stage_; }
  const PipelineLayout& layout() const { return layout_; }
  int stage() const { return stage_; }

  // Every parameter held here, chunk by chunk in global order.
  std::vector<model::Param*> params();
  // The parameters this rank owns: all but the last chunk's copy of a tied
  // embedding when there is more than one chunk (chunk 0 owns the matrix,
  // even on this rank when P = 1 and V > 1). Concatenating every rank's
  // owned parameters in chunk order gives the single-process table's order.
  // Grouped by local chunk.
  std::vector<std::vector<model::Param*>> owned_params();
  // The last chunk's copy of a tied embedding, on the stage that holds the
  // last chunk (P-1) when the model has more than one chunk (C = P*V > 1,
  // so also at P = 1 with V > 1); nullptr otherwise (untied, a single chunk,
  // or another stage).
  model::Param* tied_copy();
  // Chunk 0's embedding matrix (stage 0); else nullptr.
  model::Param* embedding();

 private:
  PipelineLayout layout_;
  int stage_;
  bool tied_;
  std::vector<std::unique_ptr<model::Model>> chunks_;
};

// Times the computes of a step: on the host's clock for CPU chunks; for GPU
// chunks with CUDA events on the compute stream (cuda::StreamClock), since
// there the host only queues the kernels and runs ahead of the device, and
// its clock would time the queueing. mark() makes a point (now, or after the
// work queued so far); seconds(a, b) is the time between two points (on the
// GPU it waits for b).
class StepTimer {
 public:
  explicit StepTimer(Device device);
  ~StepTimer();
  void reset();
  int mark();
  double seconds(int a, int b) const;

 private:
  std::unique_ptr<cuda::StreamClock> gpu_;
  std::vector<std::chrono::steady_clock::time_point> cpu_;
};

using DataFn = std::function<data::TokenLoader::Batch(int mb)>;
// In place of the loss, on the rank that holds the last chunk: what a
// forward-only pass does with microbatch mb's head input `st` (e.g. per-token
// log-probabilities for multiple-choice scoring), given `head`, the chunk
// holding the final Mix, norm and LM head.
using HeadFn = std::function<void(int mb, model::Model& head, const model::DepthState& st,
                                  model::Activations& acts)>;

// One compute action's span, in seconds since the step began (on the GPU:
// the device's time, StepTimer).
struct ComputeTime {
  Action action;
  double start = 0, end = 0;
};

// What a step did: the executor fills in this rank's share, the runtime
// (Runtime::train_step) reduces it over the ranks; the trainer logs it.
// Times are the device's (StepTimer).
struct StepStats {
  double loss_sum = 0;   // summed token loss of the microbatches whose last chunk ran here,
                         // then over all replicas
  int64_t pp_bytes = 0;  // pipeline bytes this rank sent, then all ranks
  double busy_sec = 0;   // time in forward/backward compute
  double wall_sec = 0;   // start of the step to the end of this rank's last action
  // Runtime: (slowest rank's wall - mean busy) / mean busy; not measured
  // (empty) when ranks that talk to each other ran their steps as CUDA
  // graphs, which time the whole step only.
  std::optional<double> bubble;
  // Tensor bytes live at the step's start on this rank (weights, gradients,
  // optimizer state: the resident state), and the high-water mark above it
  // during the step (activations, messages, workspace); then, in the
  // runtime, the largest over the ranks.
  int64_t resident_bytes = 0, peak_step_bytes = 0;
  // In the runtime: every world rank's own resident_bytes (rank = replica P +
  // stage), so a log can show how ZeRO-1's owners spread the state.
  std::vector<int64_t> resident_by_rank;
  std::vector<ComputeTime> trace;  // this rank's computes, when tracing (set_trace)
};

class PipelineExecutor {
 public:
  PipelineExecutor(const model::ModelConfig& cfg, RankModel& model, Transport& transport,
                   bool cache_blocks, int64_t B, int64_t T);

  // Forward + backward of M microbatches; parameter gradients accumulate
  // (loss * grad_scale), as in Model::forward_backward. `grads_ready(v)` is
  // called as soon as local chunk v's parameter gradients are final (after
  // its last backward), to start their data-parallel sum early.
  StepStats train_step(int M, const DataFn& data, double grad_scale,
                       const std::function<void(int)>& grads_ready = {});
  // Forward only (evaluation): loss sums, nothing kept.
  StepStats forward_only(int M, const DataFn& data);
  // Forward only with `head` run in place of the loss (StepStats::loss_sum
  // stays 0). Every rank of the replica calls it with the same M.
  StepStats forward_only(int M, const DataFn& data, const HeadFn& head);
  // Record every compute's span in StepStats::trace (measuring chunk times).
  void set_trace(bool on) { trace_ = on; }
  // Time the computes (StepStats' busy and wall times, the trace): on by
  // default; off while a CUDA graph captures the step (parallel/step_graph.h),
  // whose events could not be waited for (the times stay 0).
  void set_timing(bool on) { timing_ = on; }

 private:
  struct MbState;
  struct Run;
  StepStats run(const ScheduleSpec& spec, const DataFn& data, double grad_scale,
                const std::function<void(int)>& grads_ready, const HeadFn* head = nullptr);
  const std::vector<Action>& schedule(const ScheduleSpec& spec);
  void forward(Run& run, const Action& a);
  void backward(Run& run, const Action& a);
  Tensor new_tensor(int64_t count) const;  // [count * N, d] in the activation dtype
  Tensor pack(const BoundaryMessage& bm, const Tensor& hidden,
              const std::function<Tensor(int64_t)>& source, const Tensor& partial, int chunk) const;
  void unpack(const BoundaryMessage& bm, const Tensor& buf, Tensor& hidden,
              const std::function<void(int64_t, Tensor)>& source, Tensor& partial) const;

  model::ModelConfig cfg_;
  RankModel& model_;
  Transport& transport_;
  const PipelineLayout& layout_;
  DepthPlan plan_;
  bool cache_;
  StepTimer timer_;
  bool trace_ = false;
  bool timing_ = true;
  int64_t B_, T_;
  std::map<std::pair<int, bool>, std::vector<Action>> schedules_;  // (M, forward_only)
};

}  // namespace attnres::parallel
