// ZeRO-1 (parallel.zero = 1): the AdamW state and fp32 master weights of a
// chunk split over the D data-parallel replicas of its stage.
//
// A chunk's parameters, flattened in table order and padded with zeros to
// D * n elements, form one flat space; replica d owns elements
// [d * n, (d + 1) * n). Per step: the gradients are reduce-scattered (each
// replica gets the sum of its own slice only), each replica's optimizer
// updates its slice, and the updated weights are all-gathered. The gradient
// norm sums the owned slices' squares over the replicas.
//
// The parameters of each value dtype form spaces of their own (a bf16 run
// keeps its routers' values in fp32: their space is all-gathered in fp32).
//
// With expert parallelism (EP > 1) the routed experts' parameters form a
// second space, split the same way over the G = D / EP replicas that hold
// those experts (member d div EP of its Replicas::SameExperts group): an
// expert's state is sharded over the replicas holding it.
//
// Parameters that must be updated whole (Muon's matrices: each Newton-Schulz
// needs the whole summed gradient) are not sliced: each has one owner
// replica, and they form spaces of their own where member r's block [r n,
// (r + 1) n) holds the matrices it owns, one after another (n: the largest
// block; the rest is padding). Owners are chosen to balance the
// Newton-Schulz work (about min(a, b)^2 max(a, b) for an a x b matrix):
// largest first, each to the member with the least work so far. The same
// reduce-scatter then gives each owner its matrices' whole sums, and the
// all-gather gives every replica their updated weights.
#pragma once
#include <cstdint>
#include <vector>

#include "core/tensor.h"
#include "model/params.h"
#include "parallel/transport.h"

namespace attnres::parallel {

// The elements [lo, hi) of one parameter (flattened) that a replica owns;
// empty when hi <= lo.
struct OwnedRange {
  int64_t lo = 0, hi = 0;
  int64_t size() const { return hi > lo ? hi - lo : 0; }
};

// The owner (0 .. members-1) of each matrix updated whole, from their shapes
// (a x b, the rest of the dims folded into b): the largest Newton-Schulz work
// min(a, b)^2 max(a, b) first, each to the member with the least so far
// (ties: the lower index). ZeroShard's choice; the memory planner's too.
std::vector<int> whole_owners(const std::vector<Shape>& shapes, int members);

class ZeroShard {
 public:
  // `params`: the chunk's table in order; this is replica `replica` of D,
  // with expert parallelism EP; whole[i]: parameter i is updated whole
  // (empty: none is).
  ZeroShard(std::vector<model::Param*> params, int D, int replica, int EP = 1,
            const std::vector<bool>& whole = {});

  // The flat spaces: 0 (every sliced parameter but the routed experts'),
  // then, where they have parameters, the whole ones', the routed experts'
  // sliced and whole ones (EP > 1); the replicas each spans.
  int spaces() const { return static_cast<int>(spaces_.size()); }
  Replicas group(int s) const { return spaces_.at(static_cast<size_t>(s)).group; }
  int64_t shard_elements(int s) const { return spaces_.at(static_cast<size_t>(s)).n; }
  // Per parameter: the elements this replica owns (a whole one's: all or none).
  const std::vector<OwnedRange>& owned() const { return owned_; }
  // The owned part of a parameter-shaped tensor, as a flat view (shares storage).
  Tensor owned_view(size_t i, const Tensor& t) const;

  // Space s's gradients as its flat [size * n] (F32, on the parameters' device).
  Tensor pack_grads(int s) const;
  // Its summed slice [n] from the reduce-scatter, written into the owned
  // elements of the gradients (the rest of each gradient is stale).
  void unpack_owned_grads(int s, const Tensor& mine) const;
  // This replica's slice [n] of space s (of `dtype`) from per-parameter
  // owned tensors (as owned_view gives them; one per parameter, those of
  // other spaces ignored, undefined ones zeros), and space s's whole flat back into its
  // parameters' tensors (`out[i]` shaped like parameter i, of flat's dtype).
  Tensor pack_owned(int s, const std::vector<Tensor>& owned_parts, DType dtype = DType::F32) const;
  void unpack_all(int s, const Tensor& flat, std::vector<Tensor>& out) const;
  // Views of space s's whole flat [size * n] shaped like its parameters, at
  // their places in `out` (one per parameter; no copy).
  void views(int s, const Tensor& flat, std::vector<Tensor>& out) const;
  int members(int s) const { return spaces_.at(static_cast<size_t>(s)).size; }
  // Its parameters (indices into the table), in table order.
  const std::vector<size_t>& params(int s) const { return spaces_.at(static_cast<size_t>(s)).params; }

 private:
  struct Space {
    Replicas group;
    int size = 1, member = 0;  // replicas it spans; this one's place among them
    bool whole = false;        // parameters by owner (see the top of the file)
    int64_t n = 0;             // elements per replica
    std::vector<size_t> params;
  };
  std::vector<model::Param*> params_;
  std::vector<int> space_of_;     // each parameter's space
  std::vector<int64_t> offset_;   // its start in that space
  std::vector<OwnedRange> owned_;
  std::vector<Space> spaces_;
  Device device_ = Device::CPU;
};

}  // namespace attnres::parallel
