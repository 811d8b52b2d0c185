#include "parallel/zero.h"

#include <algorithm>

#include "core/error.h"

namespace attnres::parallel {

namespace {
Tensor flat_view(const Tensor& t) { return t.reshape({t.numel()}); }
}  // namespace

ZeroShard::ZeroShard(std::vector<model::Param*> params, int D, int replica)
    : params_(std::move(params)), D_(D), replica_(replica) {
  ATTNRES_CHECK(D >= 1 && replica >= 0 && replica < D, "ZeroShard: replica ", replica, " of ", D);
  int64_t total = 0;
  for (const model::Param* p : params_) {
    offset_.push_back(total);
    total += p->value.numel();
  }
  if (!params_.empty()) device_ = params_.front()->value.device();
  n_ = (total + D - 1) / D;
  const int64_t begin = replica * n_, end = std::min(total, begin + n_);
  for (size_t i = 0; i < params_.size(); ++i) {
    const int64_t o = offset_[i], len = params_[i]->value.numel();
    owned_.push_back({std::clamp(begin - o, int64_t{0}, len), std::clamp(end - o, int64_t{0}, len)});
  }
}

Tensor ZeroShard::owned_view(size_t i, const Tensor& t) const {
  const OwnedRange r = owned_.at(i);
  return flat_view(t).rows(r.lo, r.size());
}

Tensor ZeroShard::pack_grads() const {
  Tensor flat = Tensor::zeros({n_ * D_}, DType::F32, device_);  // zero padding
  for (size_t i = 0; i < params_.size(); ++i) {
    const Tensor& g = params_[i]->grad;
    ATTNRES_CHECK(g.dtype() == DType::F32, "ZeRO-1 needs F32 gradients, ", params_[i]->name,
                  " has ", g.describe());
    flat.rows(offset_[i], g.numel()).copy_from(flat_view(g));
  }
  return flat;
}

void ZeroShard::unpack_owned_grads(const Tensor& mine) const {
  const int64_t begin = replica_ * n_;
  for (size_t i = 0; i < params_.size(); ++i) {
    const OwnedRange r = owned_[i];
    if (r.size() > 0)
      owned_view(i, params_[i]->grad).copy_from(mine.rows(offset_[i] + r.lo - begin, r.size()));
  }
}

Tensor ZeroShard::pack_owned(const std::vector<Tensor>& owned_parts, DType dtype) const {
  ATTNRES_CHECK(owned_parts.size() == params_.size(), "pack_owned: ", owned_parts.size(),
                " tensors for ", params_.size(), " parameters");
  Tensor mine = Tensor::zeros({n_}, dtype, device_);
  const int64_t begin = replica_ * n_;
  for (size_t i = 0; i < params_.size(); ++i) {
    const OwnedRange r = owned_[i];
    if (r.size() > 0)
      mine.rows(offset_[i] + r.lo - begin, r.size()).copy_from(flat_view(owned_parts[i]));
  }
  return mine;
}

void ZeroShard::unpack_all(const Tensor& flat, std::vector<Tensor>& out) const {
  ATTNRES_CHECK(out.size() == params_.size() && flat.numel() == n_ * D_, "unpack_all: ",
                out.size(), " tensors for ", params_.size(), " parameters");
  for (size_t i = 0; i < params_.size(); ++i)
    flat_view(out[i]).copy_from(flat.rows(offset_[i], out[i].numel()));
}

std::vector<Tensor> ZeroShard::views(const Tensor& flat) const {
  ATTNRES_CHECK(flat.numel() == n_ * D_, "views of ", flat.describe(), ": expected ", n_ * D_,
                " elements");
  std::vector<Tensor> out;
  for (size_t i = 0; i < params_.size(); ++i) {
    const Tensor& p = params_[i]->value;
    out.push_back(flat.rows(offset_[i], p.numel()).reshape(p.shape()));
  }
  return out;
}

}  // namespace attnres::parallel
