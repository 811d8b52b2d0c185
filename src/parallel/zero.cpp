#include "parallel/zero.h"

#include <algorithm>

#include "core/error.h"

namespace attnres::parallel {

namespace {
Tensor flat_view(const Tensor& t) { return t.reshape({t.numel()}); }
}  // namespace

std::vector<int> whole_owners(const std::vector<Shape>& shapes, int members) {
  auto work = [&](size_t i) {
    const Shape& s = shapes[i];
    double a = s.empty() ? 1.0 : static_cast<double>(s[0]), b = 1.0;
    for (size_t k = 1; k < s.size(); ++k) b *= static_cast<double>(s[k]);
    return std::min(a, b) * std::min(a, b) * std::max(a, b);
  };
  std::vector<size_t> order(shapes.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t x, size_t y) { return work(x) > work(y); });
  std::vector<double> load(static_cast<size_t>(members), 0.0);
  std::vector<int> owner(shapes.size(), 0);
  for (size_t i : order) {
    const auto r = static_cast<size_t>(std::min_element(load.begin(), load.end()) - load.begin());
    owner[i] = static_cast<int>(r);
    load[r] += work(i);
  }
  return owner;
}

ZeroShard::ZeroShard(std::vector<model::Param*> params, int D, int replica, int EP,
                     const std::vector<bool>& whole)
    : params_(std::move(params)) {
  ATTNRES_CHECK(D >= 1 && replica >= 0 && replica < D && EP >= 1 && D % EP == 0,
                "ZeroShard: replica ", replica, " of ", D, ", expert parallelism ", EP);
  ATTNRES_CHECK(whole.empty() || whole.size() == params_.size(), "ZeroShard: ", whole.size(),
                " whole flags for ", params_.size(), " parameters");
  if (!params_.empty()) device_ = params_.front()->value.device();
  // The spaces: (value dtype, experts?, whole?) in that order, the first
  // always. The dtypes in table order of first appearance: one in fp32 runs;
  // in bf16 runs the bf16 parameters', then the fp32 ones' (the routers,
  // model::ParamShape::full_precision), each space all-gathered in its own.
  std::vector<DType> dtypes;
  for (const model::Param* p : params_)
    if (std::find(dtypes.begin(), dtypes.end(), p->value.dtype()) == dtypes.end())
      dtypes.push_back(p->value.dtype());
  if (dtypes.empty()) dtypes.push_back(DType::F32);
  auto space_key = [&](size_t i) {
    const bool expert = EP > 1 && params_[i]->expert >= 0;
    const auto dt = std::find(dtypes.begin(), dtypes.end(), params_[i]->value.dtype()) - dtypes.begin();
    return 4 * static_cast<int>(dt) + 2 * int(expert) + int(!whole.empty() && whole[i]);
  };
  space_of_.assign(params_.size(), 0);
  offset_.assign(params_.size(), 0);
  std::vector<int> owner(params_.size(), -1);  // a whole parameter's member
  for (int key = 0; key < 4 * static_cast<int>(dtypes.size()); ++key) {
    std::vector<size_t> members;
    for (size_t i = 0; i < params_.size(); ++i)
      if (space_key(i) == key) members.push_back(i);
    if (members.empty() && key > 0) continue;
    const bool expert = key % 4 >= 2;
    Space sp{expert ? Replicas::SameExperts : Replicas::All, expert ? D / EP : D,
             expert ? replica / EP : replica, key % 2 == 1, 0, members};
    for (size_t i : members) space_of_[i] = static_cast<int>(spaces_.size());
    if (!sp.whole) {
      int64_t total = 0;
      for (size_t i : members) offset_[i] = total, total += params_[i]->value.numel();
      sp.n = (total + sp.size - 1) / sp.size;
    } else {
      std::vector<Shape> shapes;
      for (size_t i : members) shapes.push_back(params_[i]->value.shape());
      const std::vector<int> owners = whole_owners(shapes, sp.size);
      for (size_t k = 0; k < members.size(); ++k) owner[members[k]] = owners[k];
      // Each member's block: its matrices in table order.
      std::vector<int64_t> fill(static_cast<size_t>(sp.size), 0);
      for (size_t i : members) fill[static_cast<size_t>(owner[i])] += params_[i]->value.numel();
      sp.n = *std::max_element(fill.begin(), fill.end());
      std::fill(fill.begin(), fill.end(), 0);
      for (size_t i : members) {
        const auto r = static_cast<size_t>(owner[i]);
        offset_[i] = static_cast<int64_t>(r) * sp.n + fill[r];
        fill[r] += params_[i]->value.numel();
      }
    }
    spaces_.push_back(std::move(sp));
  }
  for (size_t i = 0; i < params_.size(); ++i) {
    const Space& sp = spaces_[static_cast<size_t>(space_of_[i])];
    const int64_t begin = sp.member * sp.n, end = begin + sp.n;
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
    if (r.size() > 0 && owned_parts[i].defined())  // undefined: zeros (a state Muon lacks)
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
