#include "parallel/runtime.h"

#include <cmath>
#include <cstring>

#include "core/error.h"
#include "kernels/reduce.h"
#include "parallel/mpi_transport.h"
#include "parallel/nccl_transport.h"

namespace attnres::parallel {

std::unique_ptr<Transport> make_transport(TransportKind kind, const ProcessGrid& grid) {
  if (grid.world().is_solo()) return std::make_unique<LocalTransport>();
  if (kind == TransportKind::Nccl) return make_nccl_transport(grid);
  ATTNRES_CHECK(kind == TransportKind::Mpi, "make_transport: resolve TransportKind::Auto first");
  return std::make_unique<MpiTransport>(grid);
}

Runtime::Runtime(const ProcessGrid& grid, const model::ModelConfig& cfg, DType dtype, Device device,
                 const RuntimeOptions& opt, int64_t B, int64_t T)
    : grid_(grid), cfg_(cfg), layout_(cfg.n_layers, grid.P(), opt.V, opt.layers_per_chunk) {
  model_ = std::make_unique<RankModel>(cfg, dtype, device, layout_, grid.stage(),
                                       grid.expert_rank(), grid.EP());
  for (int v = 0; v < model_->size(); ++v) {
    model_->chunk(v).set_recompute(opt.recompute);
    if (opt.zero) {
      std::vector<model::Param*> ps;
      std::vector<bool> whole;
      for (auto& p : model_->chunk(v).params().all()) {
        ps.push_back(&p);
        whole.push_back(opt.zero_whole && opt.zero_whole(p));
      }
      zero_.emplace_back(std::move(ps), grid.D(), grid.replica(), grid.EP(), whole);
    }
  }
  transport_ = make_transport(opt.transport, grid);
  if (grid.EP() > 1) {
    exchange_ = std::make_unique<GroupExpertExchange>(grid, *transport_);
    for (int v = 0; v < model_->size(); ++v) model_->chunk(v).set_expert_exchange(exchange_.get());
  }
  executor_ = std::make_unique<PipelineExecutor>(cfg, *model_, *transport_, opt.cache_blocks, B, T);
  if (opt.cuda_graphs) {
    // train::Config::validate and the trainer's transport choice refuse the
    // rest in the config's words.
    ATTNRES_CHECK(device == Device::CUDA, "CUDA graphs: the step of a CUDA run only");
    ATTNRES_CHECK(grid.world().size() == 1 || transport_->graph_capturable(),
                  "CUDA graphs: ", grid.world().size(), " ranks talking through the ",
                  transport_->name(), " transport cannot capture their steps (NCCL can)");
    // What the step defers per microbatch (parallel/step_graph.h): the
    // embedding's id checks, forward and backward, where chunk 0 runs; the
    // cross-entropy's loss and target check where the last chunk runs.
    const bool first = grid.stage() == layout_.rank_of(0);
    const bool last = grid.stage() == layout_.rank_of(layout_.C() - 1);
    graph_ = std::make_unique<StepGraph>(B, T, (first ? 2u : 0u) + (last ? 1u : 0u), first || last);
  }
}

StepStats Runtime::train_step(int M, const DataFn& data, double grad_scale, bool graph) {
  StepStats st;
  const int64_t launched_before = graph_launches();
  if (graph_ && graph) {
    st = graph_->run(M, data, [&](const DataFn& d, bool capturing) {
      executor_->set_timing(!capturing);
      StepStats s = local_step(M, d, grad_scale);
      executor_->set_timing(true);
      return s;
    });
  } else {
    trim_device_memory();  // an eager step beside a graph (depth statistics)
    st = local_step(M, data, grad_scale);
    trim_device_memory();
  }
  double sums[3] = {st.loss_sum, static_cast<double>(st.pp_bytes), st.busy_sec};
  grid_.world().allreduce_sum(sums, 3);
  grid_.world().allreduce_max(&st.wall_sec, 1);
  for (const auto& r : grid_.world().allgather(std::vector<double>{static_cast<double>(st.resident_bytes)}))
    st.resident_by_rank.push_back(static_cast<int64_t>(r.at(0)));  // exact: bytes < 2^53
  int64_t mem[2] = {st.resident_bytes, st.peak_step_bytes};
  grid_.world().allreduce_max(mem, 2);
  st.resident_bytes = mem[0];
  st.peak_step_bytes = mem[1];
  st.loss_sum = sums[0];
  st.pp_bytes = static_cast<int64_t>(sums[1]);
  st.busy_sec = sums[2] / grid_.world().size();  // the mean
  // A graph times the whole step: with peers that includes waiting for them.
  if (graph_launches() == launched_before || grid_.world().size() == 1)
    st.bubble = st.busy_sec > 0 ? std::max(0.0, (st.wall_sec - st.busy_sec) / st.busy_sec) : 0.0;
  return st;
}

StepStats Runtime::local_step(int M, const DataFn& data, double grad_scale) {
  for (model::Param* p : model_->params()) p->grad.zero_();
  // Data parallel: each chunk's gradients are summed over the replicas as
  // soon as its last backward is done, overlapping the rest of the step
  // (the loss scale already divides by the global token count). Every
  // replica runs the same schedule, so they start these sums in the same order.
  // Per chunk: its sums in flight (with expert parallelism the routed
  // experts' over the replicas holding them, the rest over all D; with
  // ZeRO-1 one reduce-scatter per ZeroShard space).
  std::vector<std::vector<std::unique_ptr<PendingSum>>> pending(static_cast<size_t>(model_->size()));
  auto finish = [](std::vector<std::unique_ptr<PendingSum>>& sums) {
    for (auto& p : sums) p->finish();
    sums.clear();
  };
  // ZeRO-1: each replica receives the sum of its own slice only. A chunk
  // holding a tied embedding (or its copy) waits for the tied sum below,
  // which needs the whole gradient.
  const bool tied = cfg_.tie_embeddings && layout_.C() > 1;
  auto holds_tied = [&](int v) {
    return tied && (model_->chunk_id(v) == 0 || model_->chunk_id(v) == layout_.C() - 1);
  };
  std::vector<std::vector<Tensor>> mine(zero_.size());  // per chunk, per space
  auto start_scatter = [&](int v) {
    const auto i = static_cast<size_t>(v);
    const ZeroShard& z = zero_[i];
    for (int sp = 0; sp < z.spaces(); ++sp) {
      mine[i].push_back(Tensor::empty({z.shard_elements(sp)}, DType::F32, model_->chunk(v).device()));
      pending[i].push_back(
          transport_->start_reduce_scatter(z.pack_grads(sp), mine[i].back(), z.group(sp)));
    }
  };
  auto grads_ready = [&](int v) {
    if (!zero_.empty()) {
      if (!holds_tied(v)) start_scatter(v);
      return;
    }
    if (grid_.D() == 1) return;
    std::vector<Tensor> grads, expert_grads;
    for (auto& p : model_->chunk(v).params().all())
      (grid_.EP() > 1 && p.expert >= 0 ? expert_grads : grads).push_back(p.grad);
    auto& sums = pending[static_cast<size_t>(v)];
    sums.push_back(transport_->start_sum_across_replicas(std::move(grads)));
    if (!expert_grads.empty())
      sums.push_back(
          transport_->start_sum_across_replicas(std::move(expert_grads), Replicas::SameExperts));
  };
  StepStats st = executor_->train_step(M, data, grad_scale, grads_ready);
  for (auto& sums : pending) finish(sums);

  // Tied embeddings: chunk 0 holds the input embedding, chunk C-1 a copy for
  // the LM head; both need the sum of both gradients (a + b == b + a, so the
  // two copies get the same bits and stay identical).
  if (cfg_.tie_embeddings && layout_.C() > 1) {
    model::Param* first = model_->embedding();
    model::Param* last = model_->tied_copy();
    if (first && last) {  // P == 1: both chunks on this rank
      kernels::add_(first->grad, last->grad);
      last->grad.copy_from(first->grad);
    } else if (first) {
      transport_->sum_with_peer(first->grad, layout_.rank_of(layout_.C() - 1));
    } else if (last) {
      transport_->sum_with_peer(last->grad, 0);
    }
  }
  for (int v = 0; v < static_cast<int>(zero_.size()); ++v) {
    const auto i = static_cast<size_t>(v);
    if (holds_tied(v)) {  // started in chunk order on every replica
      start_scatter(v);
      finish(pending[i]);
    }
    for (int sp = 0; sp < zero_[i].spaces(); ++sp)
      zero_[i].unpack_owned_grads(sp, mine[i][static_cast<size_t>(sp)]);
  }
  return st;
}

double Runtime::grad_norm() {
  // This rank's per-parameter sums of squares, preceded by how many there
  // are per local chunk; gathered over the pipeline (replicas are identical
  // after the data-parallel sum).
  const auto owned = model_->owned_params();
  std::vector<double> mine;
  for (const auto& chunk : owned) mine.push_back(static_cast<double>(chunk.size()));
  std::vector<Tensor> grads;
  for (size_t v = 0; v < owned.size(); ++v)
    for (const model::Param* p : owned[v]) {
      if (zero_.empty()) {
        grads.push_back(p->grad);
        continue;
      }
      // ZeRO-1: this replica's summed slice; the replicas' squares add up below.
      const auto& all = model_->chunk(static_cast<int>(v)).params().all();
      const size_t i = static_cast<size_t>(p - all.data());
      grads.push_back(zero_[v].owned_view(i, p->grad));
    }
  for (double s : kernels::sum_squares_each(grads)) mine.push_back(s);
  if (!zero_.empty())
    grid_.data().allreduce_sum(mine.data() + owned.size(), static_cast<int>(grads.size()));
  if (grid_.EP() > 1 && zero_.empty()) {
    // (With ZeRO-1 the sum over all D replicas above counts every expert:
    // each replica's experts' owned slices.)
    // The members of an expert group hold different experts in the same
    // places: each place's squares summed over the group count every expert.
    std::vector<double> experts;
    std::vector<size_t> at;
    size_t k = owned.size();
    for (const auto& chunk : owned)
      for (const model::Param* p : chunk) {
        if (p->expert >= 0) experts.push_back(mine[k]), at.push_back(k);
        ++k;
      }
    grid_.experts().allreduce_sum(experts.data(), static_cast<int>(experts.size()));
    for (size_t i = 0; i < at.size(); ++i) mine[at[i]] = experts[i];
  }
  const auto all = grid_.pipeline().allgather(mine);
  // Chunk c lives on stage c mod P as local chunk c div P: walk the chunks in
  // global order, which is the single-process parameter order.
  const int P = layout_.P(), V = layout_.V();
  double sq = 0;
  for (int c = 0; c < layout_.C(); ++c) {
    const auto& v = all.at(static_cast<size_t>(c % P));
    size_t at = static_cast<size_t>(V);
    for (int u = 0; u < c / P; ++u) at += static_cast<size_t>(v.at(static_cast<size_t>(u)));
    const size_t n = static_cast<size_t>(v.at(static_cast<size_t>(c / P)));
    for (size_t i = 0; i < n; ++i) sq += v.at(at + i);
  }
  return std::sqrt(sq);
}

void Runtime::trim_device_memory() {
  if (graph_) cuda::trim_memory_pool();
}

int Runtime::forward_microbatches(int M) const {
  if (grid_.EP() == 1) return M;
  int64_t m = M;
  grid_.experts().allreduce_max(&m, 1);
  return static_cast<int>(m);
}

double Runtime::eval_loss_sum(int M, const DataFn& data) {
  double loss = 0;
  const int run = forward_microbatches(M);
  if (run == M && M > 0) {
    loss = executor_->forward_only(M, data).loss_sum;
  } else if (run > M) {  // the extra microbatches' losses left out
    executor_->forward_only(run, data, [&](int mb, model::Model& m, const model::DepthState& st,
                                           model::Activations& acts) {
      if (mb < M) loss += m.head_loss(st, data(mb).targets, acts);
    });
  }
  grid_.world().allreduce_sum(&loss, 1);
  return loss;
}

const ZeroShard* Runtime::zero_shard(int v) const {
  return zero_.empty() ? nullptr : &zero_.at(static_cast<size_t>(v));
}

std::vector<Tensor> Runtime::all_gather_owned(int v, const std::vector<Tensor>& owned_parts) {
  const ZeroShard& z = zero_.at(static_cast<size_t>(v));
  std::vector<Tensor> out;
  const auto& ps = model_->chunk(v).params().all();
  for (size_t i = 0; i < ps.size(); ++i)
    out.push_back(Tensor::empty(ps[i].value.shape(), owned_parts.at(i).dtype(), ps[i].value.device()));
  for (int sp = 0; sp < z.spaces(); ++sp) {
    if (z.params(sp).empty()) continue;  // (space 0 of a chunk without parameters)
    // One dtype per space (ZeroShard groups the parameters by their values').
    const DType dtype = owned_parts.at(z.params(sp).front()).dtype();
    for (size_t i : z.params(sp))
      ATTNRES_CHECK(owned_parts[i].dtype() == dtype, "all_gather_owned: ", ps[i].name, " is ",
                    dtype_name(owned_parts[i].dtype()), " in a space of ", dtype_name(dtype));
    Tensor flat = Tensor::empty({z.shard_elements(sp) * z.members(sp)}, dtype,
                                model_->chunk(v).device());
    transport_->all_gather(z.pack_owned(sp, owned_parts, dtype), flat, z.group(sp));
    z.unpack_all(sp, flat, out);
  }
  return out;
}

std::vector<Tensor> Runtime::gather_owned_to_host(int v, const std::vector<Tensor>& owned_parts) {
  const ZeroShard& z = zero_.at(static_cast<size_t>(v));
  std::vector<Tensor> out(owned_parts.size());
  for (int sp = 0; sp < z.spaces(); ++sp) {
    const Tensor mine = z.pack_owned(sp, owned_parts, DType::F32).to(Device::CPU);
    Tensor flat = Tensor::empty({z.shard_elements(sp) * z.members(sp)}, DType::F32, Device::CPU);
    grid_.replicas(z.group(sp)).allgather_bytes(mine.raw(), mine.nbytes(), flat.raw());
    z.views(sp, flat, out);
  }
  return out;
}

void Runtime::gather_updated_weights() {
  for (int v = 0; v < static_cast<int>(zero_.size()); ++v) {
    auto& ps = model_->chunk(v).params().all();
    // The weights the optimizer updated: fp32 (a CPU or fp32 run), or in a
    // bf16 run whose optimizer holds the owned fp32 masters (train/optimizer.h)
    // the bf16 copies it wrote, all-gathered as they are (the routers' fp32
    // values in a space of their own).
    // Parameters whose whole fp32 masters are still held (take_master_slices
    // not called) all-gather those, each space in one dtype.
    std::vector<Tensor> owned;
    for (size_t i = 0; i < ps.size(); ++i) owned.push_back(zero_[v].owned_view(i, ps[i].weights()));
    const auto full = all_gather_owned(v, owned);
    for (size_t i = 0; i < ps.size(); ++i) {
      ps[i].weights().copy_from(full[i]);
      if (ps[i].master.defined()) ps[i].sync_value();
    }
  }
}

int64_t Runtime::max(int64_t v) const {
  grid_.world().allreduce_max(&v, 1);
  return v;
}

namespace {

void put(std::string& out, const void* p, size_t n) { out.append(static_cast<const char*>(p), n); }
template <typename T>
void put(std::string& out, T v) {
  put(out, &v, sizeof v);
}
template <typename T>
T get(const std::string& in, size_t& at) {
  ATTNRES_CHECK(at + sizeof(T) <= in.size(), "truncated tensor blob");
  T v;
  std::memcpy(&v, in.data() + at, sizeof v);
  at += sizeof v;
  return v;
}

}  // namespace

std::vector<NamedTensor> Runtime::gather_to_root(const std::vector<NamedTensor>& mine) const {
  if (grid_.world().size() == 1) return mine;  // nothing to move
  // Blob: per tensor name length, name, dtype, ndim, dims, raw bytes.
  std::string blob;
  for (const auto& t : mine) {
    const Tensor h = t.tensor.is_cpu() ? t.tensor : t.tensor.to(Device::CPU);
    put(blob, static_cast<uint32_t>(t.name.size()));
    put(blob, t.name.data(), t.name.size());
    put(blob, static_cast<uint8_t>(h.dtype()));
    put(blob, static_cast<uint32_t>(h.ndim()));
    for (int64_t d : h.shape()) put(blob, d);
    put(blob, h.raw(), h.nbytes());
  }
  const auto blobs = grid_.world().gather(blob, 0);
  std::vector<NamedTensor> out;
  for (const std::string& b : blobs) {
    size_t at = 0;
    while (at < b.size()) {
      NamedTensor t;
      const auto len = get<uint32_t>(b, at);
      ATTNRES_CHECK(at + len <= b.size(), "truncated tensor blob");
      t.name.assign(b.data() + at, len);
      at += len;
      const auto dtype = static_cast<DType>(get<uint8_t>(b, at));
      Shape shape(get<uint32_t>(b, at));
      for (auto& d : shape) d = get<int64_t>(b, at);
      t.tensor = Tensor::empty(shape, dtype, Device::CPU);
      ATTNRES_CHECK(at + t.tensor.nbytes() <= b.size(), "truncated tensor blob");
      std::memcpy(t.tensor.raw(), b.data() + at, t.tensor.nbytes());
      at += t.tensor.nbytes();
      out.push_back(std::move(t));
    }
  }
  return out;
}

}  // namespace attnres::parallel
