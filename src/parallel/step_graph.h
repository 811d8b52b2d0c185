// The single-GPU training step as one CUDA graph (training.cuda_graphs;
// docs/cuda.md, "CUDA graphs"): the forward and backward of all M
// microbatches, gradient zeroing included, captured once and replayed every
// step, so that the host launches one graph instead of thousands of kernels
// and never waits for the device mid-step.
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
//    capture; the step's wall and busy time are the graph's (two events).
// The optimizer, the gradient norm, evaluation and depth-statistics steps stay
// eager. The first step runs eagerly (it creates cuBLASLt's and cuDNN's plans
// and workspaces, which a capture must find made), the second captures.
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
  // Microbatches of B x T tokens.
  StepGraph(int64_t B, int64_t T);
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
