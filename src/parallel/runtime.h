// One rank's share of a P x D training job: its model chunks, the transport,
// the pipeline executor, and what has to happen between ranks around a step:
// the tied-embedding and data-parallel gradient sums, the global gradient
// norm, the global loss, and gathering tensors for a checkpoint.
//
// The optimizer stays in the train layer (train -> parallel): it updates the
// tables of model().chunk(v) with the global norm from grad_norm().
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/safetensors.h"
#include "model/model.h"
#include "parallel/executor.h"
#include "parallel/expert_exchange.h"
#include "parallel/layout.h"
#include "parallel/mpi.h"
#include "parallel/step_graph.h"
#include "parallel/transport.h"
#include "parallel/zero.h"

namespace attnres::parallel {

struct RuntimeOptions {
  int V = 1;                              // parallel.virtual_stages
  bool cache_blocks = true;               // parallel.cache_blocks
  TransportKind transport = TransportKind::Mpi;  // Mpi or Nccl
  std::vector<int64_t> layers_per_chunk;  // explicit split; empty = even
  model::Recompute recompute = model::Recompute::None;  // training.recompute
  bool zero = false;                      // parallel.zero = 1 (parallel/zero.h)
  // With zero: the parameters the optimizer updates whole (Muon's matrices:
  // ZeroShard gives each one owner); none when unset.
  std::function<bool(const model::Param&)> zero_whole;
  // training.cuda_graphs resolved: each rank's step as one CUDA graph
  // (parallel/step_graph.h); on a CUDA device, with a transport that can be
  // captured (Transport::graph_capturable: NCCL) when there are peers.
  bool cuda_graphs = false;
};

// Mpi or Nccl (parallel/nccl_transport.h); a LocalTransport on a solo grid.
std::unique_ptr<Transport> make_transport(TransportKind kind, const ProcessGrid& grid);

class Runtime {
 public:
  Runtime(const ProcessGrid& grid, const model::ModelConfig& cfg, DType dtype, Device device,
          const RuntimeOptions& opt, int64_t B, int64_t T);

  const ProcessGrid& grid() const { return grid_; }
  const PipelineLayout& layout() const { return layout_; }
  RankModel& model() { return *model_; }
  Transport& transport() { return *transport_; }
  PipelineExecutor& executor() { return *executor_; }

  // Zero the gradients, run the step's M microbatches (data(mb) gives this
  // replica's microbatch mb), then sum the tied-embedding gradients between
  // the first and last stage and every gradient over the replicas. Collective.
  // The result holds the global loss sum, pipeline bytes and bubble. With
  // RuntimeOptions::cuda_graphs and `graph` the step runs as a CUDA graph
  // (the same bits); `graph` = false runs it eagerly (depth statistics).
  StepStats train_step(int M, const DataFn& data, double grad_scale, bool graph = true);
  // Steps run as a CUDA graph so far.
  int64_t graph_launches() const { return graph_ ? graph_->launches() : 0; }
  // With a CUDA graph: device memory cached by the pool or kept by the idle
  // graph handed back (cuda::trim_memory_pool), before and after eager work
  // beside the graph (evaluation; an eager step does it itself), so the two
  // never hold their activations at once. A no-op without a graph.
  void trim_device_memory();

  // Global L2 norm of all gradients, summed in the single-process order
  // (chunk by chunk, parameter by parameter), so it matches Model's table
  // bit for bit when the gradients do (with ZeRO-1, each parameter's sum of
  // squares is the sum of its owned slices'). Collective.
  double grad_norm();

  // ZeRO-1 (RuntimeOptions::zero): the elements of local chunk v's
  // parameters this replica owns (its optimizer holds state for those
  // only); nullptr without ZeRO.
  const ZeroShard* zero_shard(int v) const;
  // After the optimizers updated their owned slices: every replica gets
  // every updated weight (all-gather; bf16 copies refreshed). A no-op
  // without ZeRO. Collective over the replicas.
  void gather_updated_weights();
  // Per-parameter owned parts of local chunk v (as ZeroShard::owned_view
  // gives them; the parts of one space of one dtype) all-gathered into full
  // tensors shaped like the parameters, of the parts' dtypes. Collective
  // over the replicas.
  std::vector<Tensor> all_gather_owned(int v, const std::vector<Tensor>& owned_parts);
  // The same for F32 parts, assembled in host memory (checkpoints): only this
  // replica's packed slice (1/D of the chunk) is on its device, so a save
  // needs no device memory of the whole chunk's size (a run that fits a GPU
  // only thanks to ZeRO-1 fits at its saves too). The tensors returned are
  // views into one host buffer per ZeroShard space. Collective over the replicas.
  std::vector<Tensor> gather_owned_to_host(int v, const std::vector<Tensor>& owned_parts);

  // Forward-only loss over this replica's M microbatches; returns the loss
  // summed over all replicas. Collective. With expert parallelism `data`
  // must also give microbatches M .. forward_microbatches(M) - 1 (run, their
  // losses left out).
  double eval_loss_sum(int M, const DataFn& data);
  // How many microbatches a forward-only pass over this replica's M runs:
  // M, or with expert parallelism the largest M of its expert group (whose
  // members exchange rows in every MoE layer, so they run the same count).
  // Collective over the expert group.
  int forward_microbatches(int M) const;

  // Collective helpers on the world communicator.
  int64_t max(int64_t v) const;

  // The tensors every rank passes (each passes what it contributes: in a
  // checkpoint, what replica 0 holds and the experts of the members of its
  // expert group), at world rank 0 in rank order; empty elsewhere. Device tensors are copied to the host (in a job of one
  // rank, `mine` is returned as it is).
  std::vector<NamedTensor> gather_to_root(const std::vector<NamedTensor>& mine) const;

 private:
  // This rank's device work of a step and the sums between ranks (the step
  // without the statistics' reduction over ranks).
  StepStats local_step(int M, const DataFn& data, double grad_scale);

  const ProcessGrid& grid_;
  model::ModelConfig cfg_;
  PipelineLayout layout_;
  std::unique_ptr<RankModel> model_;
  std::unique_ptr<Transport> transport_;
  std::unique_ptr<GroupExpertExchange> exchange_;  // expert parallelism (EP > 1)
  std::unique_ptr<PipelineExecutor> executor_;
  std::vector<ZeroShard> zero_;  // per local chunk, with ZeRO-1
  // RuntimeOptions::cuda_graphs. Declared after transport_ so that it is
  // destroyed first: NCCL (>= 2.26) destroys a communicator only once no
  // graph holding its operations is left, so the other order would hang.
  std::unique_ptr<StepGraph> graph_;
};

}  // namespace attnres::parallel
