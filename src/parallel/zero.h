// ZeRO-1 (parallel.zero = 1): the AdamW state and fp32 master weights of a
// chunk split over the D data-parallel replicas of its stage.
//
// A chunk's parameters, flattened in table order and padded with zeros to
// D * n elements, form one flat space; replica d owns elements
// [d * n, (d + 1) * n). Per step: the gradients are reduce-scattered (each
// replica gets the sum of its own slice only), each replica's optimizer
// updates its slice, and the updated weights are all-gathered. The gradient
// norm sums the owned slices' squares over the replicas.
#pragma once
#include <cstdint>
#include <vector>

#include "core/tensor.h"
#include "model/params.h"

namespace attnres::parallel {

// The elements [lo, hi) of one parameter (flattened) that a replica owns;
// empty when hi <= lo.
struct OwnedRange {
  int64_t lo = 0, hi = 0;
  int64_t size() const { return hi > lo ? hi - lo : 0; }
};

class ZeroShard {
 public:
  // `params`: the chunk's table in order; this is replica `replica` of D.
  ZeroShard(std::vector<model::Param*> params, int D, int replica);

  int64_t shard_elements() const { return n_; }  // n: elements per replica
  const std::vector<OwnedRange>& owned() const { return owned_; }
  // The owned part of a parameter-shaped tensor, as a flat view (shares storage).
  Tensor owned_view(size_t i, const Tensor& t) const;

  // The gradients as the flat [D * n] space (F32, on the parameters' device).
  Tensor pack_grads() const;
  // The summed slice [n] from the reduce-scatter, written into the owned
  // elements of the gradients (the rest of each gradient is stale).
  void unpack_owned_grads(const Tensor& mine) const;
  // This replica's slice [n] (of `dtype`) of per-parameter owned tensors (as
  // owned_view gives them), and the whole flat space back into full
  // per-parameter tensors (`out[i]` shaped like parameter i, of flat's dtype).
  Tensor pack_owned(const std::vector<Tensor>& owned_parts, DType dtype = DType::F32) const;
  void unpack_all(const Tensor& flat, std::vector<Tensor>& out) const;
  // Per-parameter views of the whole flat space [D * n], shaped like the
  // parameters (no copy).
  std::vector<Tensor> views(const Tensor& flat) const;

 private:
  std::vector<model::Param*> params_;
  std::vector<int64_t> offset_;  // start of each parameter in the flat space
  std::vector<OwnedRange> owned_;
  int D_, replica_;
  int64_t n_ = 0;
  Device device_ = Device::CPU;
};

}  // namespace attnres::parallel
