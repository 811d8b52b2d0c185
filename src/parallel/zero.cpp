#include "parallel/zero.h"

#include <algorithm>

#include "core/error.h"

namespace attnres::parallel {

namespace {
Tensor flat_view(const Tensor& t) { return t.reshape({t.numel()}); }
}  // namespace

ZeroShard::ZeroShard(std::vector<model::Param*> params, int D, int replica, int EP)
    : params_(std::move(params)) {
  ATTNRES_CHECK(D >= 1 && replica >= 0 && replica < D && EP >= 1 && D % EP == 0,
                "ZeroShard: replica ", replica, " of ", D, ", expert parallelism ", EP);
  spaces_.push_back({Replicas::All, D, replica, 0, {}});
  if (EP > 1) spaces_.push_back({Replicas::SameExperts, D / EP, replica / EP, 0, {}});
  std::vector<int64_t> total(spaces_.size(), 0);
  for (size_t i = 0; i < params_.size(); ++i) {
    const int s = EP > 1 && params_[i]->expert >= 0 ? 1 : 0;
    space_of_.push_back(s);
    offset_.push_back(total[s]);
    total[s] += params_[i]->value.numel();
    spaces_[s].params.push_back(i);
  }
  if (!params_.empty()) device_ = params_.front()->value.device();
  for (size_t s = 0; s < spaces_.size(); ++s)
    spaces_[s].n = (total[s] + spaces_[s].size - 1) / spaces_[s].size;
  for (size_t i = 0; i < params_.size(); ++i) {
    const Space& sp = spaces_[static_cast<size_t>(space_of_[i])];
    const int64_t begin = sp.member * sp.n;
    const int64_t end = std::min(total[static_cast<size_t>(space_of_[i])], begin + sp.n);
    const int64_t o = offset_[i], len = params_[i]->value.numel();
    owned_.push_back({std::clamp(begin - o, int64_t{0}, len), std::clamp(end - o, int64_t{0}, len)});
  }
}

Tensor ZeroShard::owned_view(size_t i, const Tensor& t) const {
  const OwnedRange r = owned_.at(i);
  return flat_view(t).rows(r.lo, r.size());
}

Tensor ZeroShard::pack_grads(int s) const {
  const Space& sp = spaces_.at(static_cast<size_t>(s));
  Tensor flat = Tensor::zeros({sp.n * sp.size}, DType::F32, device_);  // zero padding
  for (size_t i : sp.params) {
    const Tensor& g = params_[i]->grad;
    ATTNRES_CHECK(g.dtype() == DType::F32, "ZeRO-1 needs F32 gradients, ", params_[i]->name,
                  " has ", g.describe());
    flat.rows(offset_[i], g.numel()).copy_from(flat_view(g));
  }
  return flat;
}

void ZeroShard::unpack_owned_grads(int s, const Tensor& mine) const {
  const Space& sp = spaces_.at(static_cast<size_t>(s));
  const int64_t begin = sp.member * sp.n;
  for (size_t i : sp.params) {
    const OwnedRange r = owned_[i];
    if (r.size() > 0)
      owned_view(i, params_[i]->grad).copy_from(mine.rows(offset_[i] + r.lo - begin, r.size()));
  }
}

Tensor ZeroShard::pack_owned(int s, const std::vector<Tensor>& owned_parts, DType dtype) const {
  ATTNRES_CHECK(owned_parts.size() == params_.size(), "pack_owned: ", owned_parts.size(),
                " tensors for ", params_.size(), " parameters");
  const Space& sp = spaces_.at(static_cast<size_t>(s));
  Tensor mine = Tensor::zeros({sp.n}, dtype, device_);
  const int64_t begin = sp.member * sp.n;
  for (size_t i : sp.params) {
    const OwnedRange r = owned_[i];
    if (r.size() > 0)
      mine.rows(offset_[i] + r.lo - begin, r.size()).copy_from(flat_view(owned_parts[i]));
  }
  return mine;
}

void ZeroShard::unpack_all(int s, const Tensor& flat, std::vector<Tensor>& out) const {
  const Space& sp = spaces_.at(static_cast<size_t>(s));
  ATTNRES_CHECK(out.size() == params_.size() && flat.numel() == sp.n * sp.size, "unpack_all: ",
                out.size(), " tensors for ", params_.size(), " parameters");
  for (size_t i : sp.params) flat_view(out[i]).copy_from(flat.rows(offset_[i], out[i].numel()));
}

void ZeroShard::views(int s, const Tensor& flat, std::vector<Tensor>& out) const {
  const Space& sp = spaces_.at(static_cast<size_t>(s));
  ATTNRES_CHECK(flat.numel() == sp.n * sp.size && out.size() == params_.size(), "views of ",
                flat.describe(), ": expected ", sp.n * sp.size, " elements");
  for (size_t i : sp.params) {
    const Tensor& p = params_[i]->value;
    out[i] = flat.rows(offset_[i], p.numel()).reshape(p.shape());
  }
}

}  // namespace attnres::parallel
