// What a run keeps in memory, per pipeline rank, before it runs (`attnres
// inspect memory`, docs/memory.md): the resident state (weights, fp32 master
// weights, gradients, AdamW moments) from the parameter shapes, and the
// step's activation high-water from a replay of the tensors the model and the
// executor allocate and free.
//
// The replay follows the code: a chunk's forward allocates each sublayer's
// records in the order the model (src/model/) does and drops what training.recompute
// recomputes; its backward recomputes them, allocates the gradient
// temporaries of one sublayer at a time and frees records when the model
// does (a Mix group's at its leader). The rank's action list (the executor's
// schedule) orders the chunks' forwards and backwards and the messages, so
// microbatches in flight under 1F1B or the interleaved warm-up are counted
// as they happen. The CPU kernels take no tensors for workspace; the GPU's
// (cuBLAS, the cross-entropy's logits tiles) are not in the replay.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "train/config.h"

namespace attnres::train {

struct Buffer {
  std::string what;
  int64_t bytes = 0;
};

struct RankMemory {
  int stage = 0;
  int64_t weights = 0;    // the copy the model computes with (bf16 in a bf16 run)
  int64_t master = 0;     // fp32 master weights (bf16 runs only)
  int64_t grads = 0;
  int64_t optimizer = 0;  // AdamW's two moments (this replica's slice with parallel.zero = 1)
  // Per local chunk: bytes one microbatch's forward keeps for its backward,
  // and the most microbatches whose forward of that chunk is held at once.
  std::vector<int64_t> kept_per_microbatch;
  std::vector<int> in_flight;
  // The resident state of each data-parallel replica d of this stage (with
  // ZeRO-1 under Muon the matrices' owners differ); the fields above add up
  // each ZeRO-1 space's largest owner.
  std::vector<int64_t> replica_resident;
  int64_t activations = 0;      // the step's high-water above the resident state
  std::vector<Buffer> largest;  // the largest single tensors (up to 4), largest first
  int64_t resident() const { return weights + master + grads + optimizer; }
  int64_t total() const { return resident() + activations; }
};

// Every pipeline rank of the config's layout (parallel.pipeline x
// virtual_stages, grad_accum microbatches; the data-parallel replicas are
// copies of replica 0), with training.device / precision / recompute.
std::vector<RankMemory> plan_memory(const Config& cfg);

// The largest lo + k step (k >= 0) for which fits holds, where fits holds up
// to some value and not beyond (memory grows with the key: n_layers,
// micro_batch_size); lo - step when fits(lo) is false. Doubles, then bisects.
// The search stops at hi (or the last lo + k step below it): the answer is then
// that value, and fits is never asked beyond it (a plan's cost grows with the
// key: inspect memory bounds its searches).
int64_t largest_fitting(int64_t lo, int64_t step, const std::function<bool(int64_t)>& fits,
                        int64_t hi = int64_t{1} << 30);

}  // namespace attnres::train
