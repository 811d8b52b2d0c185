// A rank's training step as one CUDA graph (training.cuda_graphs; docs/cuda.md,
// "CUDA graphs"): the forward and backward of all M microbatches, gradient
// zeroing included, and on a rank of a pipeline or data-parallel job its
// communication too (the NCCL transport's sends, receives and sums are queued
// on streams ordered by events, Transport::graph_capturable), captured once
// and replayed every step, so that the host launches one graph instead of
// thousands of kernels and never waits for the device mid-step. Every rank
// captures the same step of the same schedule, so the NCCL operations in the
// graphs match as the eager ones do (NCCL's rule: a captured operation is
// captured on every rank it involves).
//
// What changes against an eager step, and why the bits do not:
//  - Inputs: the step's tokens and targets are staged into fixed device
//    buffers (one asynchronous copy from pinned memory before each launch),
//    since a replay reads the pointers of the capture. Same values.
//  - Results read back: the ops that read a result at once (the embedding's id
//    checks, the cross-entropy's loss and target check) defer it into slots
//    (cuda::DeferredChecks) that are read with one copy after the launch; the
//    losses are added in microbatch order, as the executor adds them, and a
//    bad id raises the eager step's error after the run.
//  - Times: the executor's per-compute events cannot be waited for inside a
//    capture; the step's wall time is the graph's (two events), and so is its
//    busy time (exact alone; with peers the graph also waits for them, so the
//    runtime then leaves the bubble unmeasured).
//  - Messages: a send completes at the step's end instead of as soon as the
//    link is done (the executor cannot ask a captured event), so its buffer
//    is held to the end of the step (more memory on a pipeline rank); the
//    order of everything on the GPU is unchanged.
// The optimizer, the gradient norm, evaluation and depth-statistics steps stay
// eager. The first step runs eagerly (it creates cuBLASLt's and cuDNN's plans
// and workspaces, which a capture must find made, and NCCL's first
// point-to-point operations), the second captures.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>

#include "core/device.h"
#include "core/tensor.h"
#include "parallel/executor.h"

namespace attnres::parallel {

class StepGraph {
 public:
  // Microbatches of B x T tokens. `deferred_per_microbatch`: the results the
  // rank's step defers per microbatch (parallel::Runtime counts them from the
  // chunks it holds); `reads_data`: whether the step reads tokens or targets
  // (it holds the first or the last chunk), else nothing is staged.
  StepGraph(int64_t B, int64_t T, size_t deferred_per_microbatch, bool reads_data);
  ~StepGraph();

  // One step of M microbatches: `step(data, capturing)` queues the step's
  // device work (zeroing, forward, backward) reading microbatch mb from
  // data(mb), with the executor's timing off while `capturing`. Runs it
  // eagerly the first time, captures it the next (and whenever M changes),
  // then launches the graph. Returns what an eager step returns, the loss
  // included; throws the eager step's error for a bad token or target id.
  StepStats run(int M, const DataFn& data,
                const std::function<StepStats(const DataFn&, bool capturing)>& step);

  // Steps run by launching the graph (0 before the capture).
  int64_t launches() const { return launches_; }

 private:
  void stage(int M, const DataFn& data);  // the step's inputs into staged_

  int64_t B_, T_;
  size_t deferred_per_microbatch_;
  bool reads_data_;
  bool warm_ = false;  // the eager first step ran
  int M_ = 0;          // microbatches of the captured graph
  Tensor staged_;                             // device, I32 [2 M B T]: tokens, then targets
  std::unique_ptr<cuda::HostBuffer> pinned_;  // the same, in pinned host memory
  std::unique_ptr<cuda::DeferredChecks> checks_;
  std::unique_ptr<cuda::StreamGraph> graph_;
  std::unique_ptr<cuda::StreamClock> clock_;  // the launch's time
  StepStats captured_;  // the capture's statistics (memory) for every replay
  int64_t launches_ = 0;
};

}  // namespace attnres::parallel
