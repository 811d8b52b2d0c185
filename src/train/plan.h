// What a pipeline run will cost, before it runs (docs/parallel.md "Predicting
// a run"): the config's model, a layout (P x V x D, naive or cached blocks)
// and a hardware profile become the per-chunk times, message sizes, links,
// gradient sums and update of parallel::StepCosts, and the simulator
// (parallel/simulator.h) turns them into a step time.
//
// Where chunk times come from:
//  - profile "cpu": measured here, by running the config's model split into
//    the layout's chunks in one process (P = 1, V = P*V: the same executor
//    and kernels as the real ranks) at the thread count each rank will get;
//  - GPU profiles: from FLOPs at the efficiency (model FLOP/s over peak) our
//    H100 runs measured, plus the AttnRes Mix's HBM traffic.
#pragma once
#include <string>
#include <vector>

#include "parallel/simulator.h"
#include "train/config.h"

namespace attnres::train {

// The numbers a prediction needs about a machine. Every value is an input;
// docs/parallel.md lists their sources.
struct HardwareProfile {
  std::string name, description;
  bool measure_cpu = false;        // chunk times measured on this CPU
  double peak_flops = 0;           // per device, dense bf16
  double efficiency = 0;           // model FLOP/s over peak the layers reach
  double hbm_bytes_per_sec = 0;    // per device, achievable
  double device_bytes = 0;         // memory per device (0: not checked)
  int devices_per_node = 1;
  parallel::LinkCost intra_node, inter_node;
  double cores = 0;                // ranks share this many cores (CPU); 0 = a device each
};
// "cpu" (this machine under MPI: its cores, a measured copy bandwidth) or
// "h100" (8 per node, NVLink 4 inside a node, 400 Gb/s InfiniBand across).
// Throws attnres::Error naming the known profiles.
HardwareProfile hardware_profile(const std::string& name);

struct PlanLayout {
  int P = 1, V = 1, D = 1;  // pipeline stages, virtual stages, data-parallel replicas
  int M = 1;                // microbatches per replica and step
  bool cache = true;        // cross-stage block caching
  int EP = 1;               // expert parallelism (parallel.expert): groups of EP replicas
  std::vector<int64_t> split;  // layers per chunk (parallel.layers_per_chunk); empty: even
  int gpus() const { return P * D; }
};
std::string describe(const PlanLayout& l);
// The config's own layout (parallel.*, grad_accum microbatches per replica).
PlanLayout layout_of(const Config& cfg);
// OpenMP threads each rank gets with the cpu profile: the cores shared among
// the job's ranks, as the trainer splits them (parallel/mpi.h share_node_cores).
int threads_per_rank(const HardwareProfile& hw, const PlanLayout& l);

// A split of the layers into the layout's P*V chunks balanced by modeled
// cost (docs/parallel.md "Balancing stages"): each chunk's forward + backward
// seconds from its FLOPs, Mix reads and all-to-alls as predict() models them
// (embedding in chunk 0, the final norm, head and loss in the last); the
// contiguous split whose costliest chunk is cheapest, then single-layer
// boundary moves that lower the busiest rank's sum of its V chunks.
std::vector<int64_t> balanced_split(const Config& cfg, const PlanLayout& layout,
                                    const HardwareProfile& hw);

// Per global chunk: forward and backward seconds of one microbatch, and the
// optimizer update's seconds.
struct ChunkTimes {
  std::vector<double> fwd, bwd, update;
};
// Measured on this CPU with `threads` OpenMP threads: median over `steps`
// steps (after one warm-up) of the mean per microbatch.
// `split`: layers per chunk (empty: even).
ChunkTimes measure_chunk_times(const Config& cfg, int chunks, int threads, int steps,
                               const std::vector<int64_t>& split = {});

struct Prediction {
  PlanLayout layout;
  parallel::SimResult sim;
  double step_time = 0, tokens_per_sec = 0, mfu = 0;
  double exposed_comm = 0;   // step time over the same step with free messages
  double bytes_per_rank = 0; // the largest rank's total (train/memory.h)
  bool fits = true;          // bytes_per_rank within the device's memory
};

// `measured` is required for a profile that measures (and must match the
// layout's chunks); it is ignored otherwise.
Prediction predict(const Config& cfg, const PlanLayout& layout, const HardwareProfile& hw,
                   const ChunkTimes* measured = nullptr);

// Layouts of `gpus` devices for the config's global batch (grad_accum x
// data microbatches): every P dividing gpus with P <= n_layers, D = gpus / P
// dividing the global microbatches, V in {1, 2, 4} where the schedule
// allows it, naive and cached blocks (AttnRes only); the config's
// parallel.expert where it divides D (else that D is left out).
std::vector<PlanLayout> candidate_layouts(const Config& cfg, int gpus);

}  // namespace attnres::train
