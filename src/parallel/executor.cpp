#include "parallel/executor.h"

#include <algorithm>
#include <chrono>
#include <tuple>

#include "core/device.h"
#include "core/error.h"
#include "kernels/common.h"
#include "kernels/mix.h"
#include "kernels/reduce.h"

namespace attnres::parallel {

namespace kern = attnres::kernels;
using Clock = std::chrono::steady_clock;

// ---------------------------------------------------------------------------
// RankModel
// ---------------------------------------------------------------------------

RankModel::RankModel(const model::ModelConfig& cfg, DType dtype, Device device,
                     const PipelineLayout& layout, int stage, int expert_rank, int EP)
    : layout_(layout), stage_(stage), tied_(cfg.tie_embeddings) {
  ATTNRES_CHECK(stage >= 0 && stage < layout.P(), "stage ", stage, " of ", layout.P());
  ATTNRES_CHECK(EP == 1 || (cfg.has_moe() && cfg.moe.experts % EP == 0 && expert_rank < EP),
                "expert parallelism ", EP, " over ", cfg.moe.experts, " experts");
  for (int c : layout.chunks_of(stage)) {
    model::ModelParts parts;
    parts.layer_begin = layout.layers(c).begin;
    parts.layer_end = layout.layers(c).end;
    parts.embedding = c == 0;
    parts.head = c == layout.C() - 1;
    if (EP > 1) {
      parts.expert_begin = expert_rank * cfg.moe.experts / EP;
      parts.expert_end = (expert_rank + 1) * cfg.moe.experts / EP;
    }
    chunks_.push_back(std::make_unique<model::Model>(cfg, dtype, parts, device));
  }
}

std::vector<model::Param*> RankModel::params() {
  std::vector<model::Param*> out;
  for (auto& m : chunks_)
    for (auto& p : m->params().all()) out.push_back(&p);
  return out;
}

std::vector<std::vector<model::Param*>> RankModel::owned_params() {
  std::vector<std::vector<model::Param*>> out(chunks_.size());
  for (int v = 0; v < size(); ++v)
    for (auto& p : chunks_[v]->params().all()) {
      // The last chunk's copy of a tied embedding belongs to chunk 0.
      if (tied_ && layout_.C() > 1 && chunk_id(v) == layout_.C() - 1 &&
          &p == chunks_[v]->handles().embedding)
        continue;
      out[v].push_back(&p);
    }
  return out;
}

model::Param* RankModel::tied_copy() {
  if (!tied_ || layout_.C() == 1 || stage_ != layout_.rank_of(layout_.C() - 1)) return nullptr;
  return chunks_.back()->handles().embedding;
}

model::Param* RankModel::embedding() {
  if (stage_ != 0) return nullptr;
  return chunks_.front()->handles().embedding;
}

// ---------------------------------------------------------------------------
// StepTimer
// ---------------------------------------------------------------------------

StepTimer::StepTimer(Device device) {
  if (device == Device::CUDA) gpu_ = std::make_unique<cuda::StreamClock>();
}
StepTimer::~StepTimer() = default;

void StepTimer::reset() {
  if (gpu_) gpu_->reset();
  cpu_.clear();
}

int StepTimer::mark() {
  if (gpu_) return gpu_->mark();
  cpu_.push_back(Clock::now());
  return static_cast<int>(cpu_.size() - 1);
}

double StepTimer::seconds(int a, int b) const {
  if (gpu_) return gpu_->seconds(a, b);
  return std::chrono::duration<double>(cpu_.at(static_cast<size_t>(b)) -
                                       cpu_.at(static_cast<size_t>(a))).count();
}

// ---------------------------------------------------------------------------
// Executor state of one run of an action list
// ---------------------------------------------------------------------------

// What one microbatch has on this rank between its first forward and its last backward.
struct PipelineExecutor::MbState {
  std::map<int64_t, Tensor> src, rstd;  // source id -> value, RMS statistics
  std::map<int64_t, Tensor> acc;        // source id -> gradient accumulated here
};

struct PipelineExecutor::Run {
  const ScheduleSpec& spec;
  const DataFn& data;
  double grad_scale;
  const std::function<void(int)>& grads_ready;
  // (is gradient, chunk it is for, microbatch)
  using Key = std::tuple<bool, int, int>;
  std::map<Key, std::pair<Request, Tensor>> recvs;  // posted receives, by consuming chunk
  std::map<Key, Tensor> outgoing;                   // produced messages, by producing chunk
  std::vector<Request> sends;
  std::map<std::pair<int, int>, model::Activations> acts;  // (chunk, mb)
  std::map<int, model::DepthGrad> head_grad;               // mb -> dL/d(state) at the head
  std::map<int, data::TokenLoader::Batch> batches;
  std::map<int, MbState> mbs;
  StepStats stats;
  const HeadFn* head = nullptr;  // forward only: replaces the loss when set

  Tensor take(const Key& key, const char* what) {
    auto it = recvs.find(key);
    ATTNRES_CHECK(it != recvs.end(), "no ", what, " receive posted for chunk ", std::get<1>(key),
                  " microbatch ", std::get<2>(key));
    it->second.first.wait();
    Tensor t = it->second.second;
    recvs.erase(it);
    return t;
  }
  const data::TokenLoader::Batch& batch(int mb) {
    auto it = batches.find(mb);
    if (it == batches.end()) it = batches.emplace(mb, data(mb)).first;
    return it->second;
  }
};

PipelineExecutor::PipelineExecutor(const model::ModelConfig& cfg, RankModel& model,
                                   Transport& transport, bool cache_blocks, int64_t B, int64_t T)
    : cfg_(cfg),
      model_(model),
      transport_(transport),
      layout_(model.layout()),
      plan_(DepthPlan::of(cfg)),
      cache_(cache_blocks),
      timer_(model.chunk(0).device()),
      B_(B),
      T_(T) {}

Tensor PipelineExecutor::new_tensor(int64_t count) const {
  model::Model& m = model_.chunk(0);
  return Tensor::empty({count * B_ * T_, cfg_.d_model}, m.dtype(), m.device());
}

// A boundary message is one [tensors * N, d] buffer: the baseline's hidden
// state alone, or the sources b_lo .. b_{hi-1} (rows of N each), then the
// partial sum when there is one. Activations and their gradients use the
// same layout; these two functions are its only writer and reader.
Tensor PipelineExecutor::pack(const BoundaryMessage& bm, const Tensor& hidden,
                              const std::function<Tensor(int64_t)>& source, const Tensor& partial,
                              int chunk) const {
  if (bm.hidden) return hidden;
  const int64_t N = B_ * T_;
  Tensor out = new_tensor(bm.tensors());
  for (int64_t j = bm.lo; j < bm.hi; ++j) out.rows((j - bm.lo) * N, N).copy_from(source(j));
  ATTNRES_CHECK(bm.partial == partial.defined(), "chunk ", chunk, ": the message ",
                bm.partial ? "needs" : "has no place for", " a partial sum");
  if (bm.partial) out.rows((bm.hi - bm.lo) * N, N).copy_from(partial);
  return out;
}

void PipelineExecutor::unpack(const BoundaryMessage& bm, const Tensor& buf, Tensor& hidden,
                              const std::function<void(int64_t, Tensor)>& source,
                              Tensor& partial) const {
  if (bm.hidden) {
    hidden = buf;
    return;
  }
  const int64_t N = B_ * T_;
  for (int64_t j = bm.lo; j < bm.hi; ++j) source(j, buf.rows((j - bm.lo) * N, N));
  if (bm.partial) partial = buf.rows((bm.hi - bm.lo) * N, N);
}

const std::vector<Action>& PipelineExecutor::schedule(const ScheduleSpec& spec) {
  auto key = std::make_pair(spec.M, spec.forward_only);
  auto it = schedules_.find(key);
  if (it == schedules_.end()) {
    auto lists = pipeline_schedule(spec);
    validate_schedule(spec, lists);
    it = schedules_.emplace(key, std::move(lists[static_cast<size_t>(model_.stage())])).first;
  }
  return it->second;
}

StepStats PipelineExecutor::train_step(int M, const DataFn& data, double grad_scale,
                                       const std::function<void(int)>& grads_ready) {
  return run({layout_.P(), layout_.V(), M, false}, data, grad_scale, grads_ready);
}

StepStats PipelineExecutor::forward_only(int M, const DataFn& data) {
  return run({layout_.P(), layout_.V(), M, true}, data, 0.0, {});
}

StepStats PipelineExecutor::forward_only(int M, const DataFn& data, const HeadFn& head) {
  return run({layout_.P(), layout_.V(), M, true}, data, 0.0, {}, &head);
}

StepStats PipelineExecutor::run(const ScheduleSpec& spec, const DataFn& data, double grad_scale,
                                const std::function<void(int)>& grads_ready, const HeadFn* head) {
  const auto& list = schedule(spec);
  Run r{spec, data, grad_scale, grads_ready, {}, {}, {}, {}, {}, {}, {}, {}, head};
  timer_.reset();
  auto mark = [&] { return timing_ ? timer_.mark() : 0; };
  const int t0 = mark();
  std::vector<std::pair<int, int>> computes;  // timer points around each compute
  const int64_t sent0 = transport_.traffic().total_sent();
  const Device dev = model_.chunk(0).device();
  const size_t resident = tensor_memory(dev).in_use;
  reset_tensor_peak(dev);
  size_t i = 0;  // the action being run, for the error message
  // A failure names this rank's action list with the failing action marked.
  auto in_list = [&](const Error& e) {
    return std::string(e.what()) + "\nwhile running pipeline rank " +
           std::to_string(model_.stage()) + "'s action list (P=" + std::to_string(spec.P) +
           " V=" + std::to_string(spec.V) + " M=" + std::to_string(spec.M) + "):\n" +
           format_actions(list, i);
  };
  try {
    while (i < list.size()) {
      // This compute's sends and the receives posted after it.
      if (!list[i].is_compute()) {
        // Sends that completed meanwhile release their buffers.
        r.sends.erase(std::remove_if(r.sends.begin(), r.sends.end(),
                                     [](Request& q) { return q.done(); }),
                      r.sends.end());
        for (; i < list.size() && !list[i].is_compute(); ++i) {
          const Action& a = list[i];
          const bool grad = a.op == Op::SendGrad || a.op == Op::RecvGrad;
          if (a.is_send()) {
            auto it = r.outgoing.find({grad, a.chunk, a.mb});
            ATTNRES_CHECK(it != r.outgoing.end(), "nothing to send for ", to_string(a));
            if (it->second.numel() > 0) r.sends.push_back(transport_.isend(it->second, a.peer));
            r.outgoing.erase(it);
          } else {
            // The message's size follows from the layout: the forward message
            // into chunk c, or the gradient of the forward message c -> c+1.
            const int into = grad ? a.chunk + 1 : a.chunk;
            const int64_t n = boundary_message(layout_, plan_, into, cache_).tensors();
            Tensor buf = new_tensor(n);
            Request req = n > 0 ? transport_.irecv(buf, a.peer) : Request();
            r.recvs.emplace(Run::Key{grad, a.chunk, a.mb}, std::make_pair(std::move(req), buf));
          }
        }
        continue;
      }
      const int c0 = mark();
      if (list[i].op == Op::Forward)
        forward(r, list[i]);
      else
        backward(r, list[i]);
      computes.emplace_back(c0, mark());
      if (trace_) r.stats.trace.push_back({list[i], 0, 0});  // times below
      ++i;
    }
    for (Request& s : r.sends) s.wait();
    // Every message used, every record and store freed: the protocol is closed.
    ATTNRES_CHECK(r.recvs.empty() && r.outgoing.empty() && r.acts.empty() && r.head_grad.empty() &&
                      r.mbs.empty(),
                  "pipeline step left state behind (", r.recvs.size(), " receives, ",
                  r.outgoing.size(), " messages, ", r.acts.size(), " activation records, ",
                  r.mbs.size(), " microbatch stores)");
  } catch (const InternalError& e) {
    throw InternalError(in_list(e));
  } catch (const Error& e) {
    throw Error(in_list(e));
  }
  r.stats.pp_bytes = transport_.traffic().total_sent() - sent0;
  r.stats.resident_bytes = static_cast<int64_t>(resident);
  r.stats.peak_step_bytes = static_cast<int64_t>(tensor_memory(dev).peak - resident);
  if (!timing_) return r.stats;
  const int end = mark();
  r.stats.wall_sec = timer_.seconds(t0, end);
  for (size_t k = 0; k < computes.size(); ++k) {
    const auto [c0, c1] = computes[k];
    r.stats.busy_sec += timer_.seconds(c0, c1);
    if (trace_) {
      r.stats.trace[k].start = timer_.seconds(t0, c0);
      r.stats.trace[k].end = timer_.seconds(t0, c1);
    }
  }
  return r.stats;
}

// ---------------------------------------------------------------------------
// Forward of one chunk
// ---------------------------------------------------------------------------

void PipelineExecutor::forward(Run& r, const Action& a) {
  const int c = a.chunk, mb = a.mb, C = layout_.C();
  model::Model& m = model_.chunk(layout_.local_index(c));
  const LayerRange lr = layout_.layers(c);
  model::Activations& acts = r.acts[{c, mb}];
  acts.B = B_;
  acts.T = T_;
  acts.loss_scale = r.grad_scale;
  MbState& s = r.mbs[mb];
  const int64_t N = B_ * T_;
  const float eps = static_cast<float>(cfg_.norm_eps);

  model::DepthState st;
  if (c == 0) {
    m.embed_forward(r.batch(mb).inputs, B_, T_, st, acts);
    if (layout_.rank_of(C - 1) != model_.stage()) r.batches.erase(mb);
    if (plan_.attnres) {
      s.src[0] = st.sources[0];
      s.rstd[0] = st.source_rstd[0];
    }
  } else {
    const BoundaryMessage bm = boundary_message(layout_, plan_, c, cache_);
    // Received sources join the store (their RMS statistics are recomputed
    // here rather than sent: same kernel, same bits, fewer bytes).
    unpack(bm, r.take({false, c, mb}, "activation"), st.hidden, [&](int64_t j, Tensor v) {
      Tensor rs = Tensor::empty({N}, kern::stat_dtype(v.dtype()), v.device());
      kern::mix_source_rstd(rs, v, eps);
      s.src[j] = v;
      s.rstd[j] = rs;
    }, st.partial);
    if (!bm.hidden) {
      for (int64_t j = 0; j < bm.hi; ++j) {
        auto it = s.src.find(j);
        ATTNRES_CHECK(it != s.src.end(), "chunk ", c, " microbatch ", mb, ": source b_", j,
                      " is neither cached on this rank nor in the message");
        st.sources.push_back(it->second);
        st.source_rstd.push_back(s.rstd.at(j));
      }
    }
  }

  m.layers_forward(lr.begin, lr.end, st, acts);

  if (plan_.attnres) {
    const int64_t n0 = plan_.sources_after(lr.begin), n1 = plan_.sources_after(lr.end);
    ATTNRES_CHECK(static_cast<int64_t>(st.sources.size()) == n1 &&
                      st.partial.defined() == plan_.partial_after(lr.end),
                  "chunk ", c, ": depth state after layers [", lr.begin, ", ", lr.end, ") has ",
                  st.sources.size(), " sources, expected ", n1);
    for (int64_t j = n0; j < n1; ++j) {
      s.src[j] = st.sources[j];
      s.rstd[j] = st.source_rstd[j];
    }
  }

  if (c == C - 1) {
    const Tensor targets = r.batch(mb).targets;
    r.batches.erase(mb);
    if (r.head) {
      (*r.head)(mb, m, st, acts);
    } else if (r.spec.forward_only) {
      r.stats.loss_sum += m.head_loss(st, targets, acts);
    } else {
      model::DepthGrad g;
      r.stats.loss_sum += m.head_forward_backward(st, targets, acts, g, r.grad_scale);
      r.head_grad[mb] = std::move(g);
    }
  } else {
    // The message into chunk c+1.
    r.outgoing[{false, c, mb}] =
        pack(boundary_message(layout_, plan_, c + 1, cache_), st.hidden,
             [&](int64_t j) { return st.sources[static_cast<size_t>(j)]; }, st.partial, c);
  }

  if (r.spec.forward_only) {
    r.acts.erase({c, mb});
    if (c == layout_.chunks_of(model_.stage()).back()) r.mbs.erase(mb);
  }
}

// ---------------------------------------------------------------------------
// Backward of one chunk
// ---------------------------------------------------------------------------

void PipelineExecutor::backward(Run& r, const Action& a) {
  const int c = a.chunk, mb = a.mb, C = layout_.C();
  model::Model& m = model_.chunk(layout_.local_index(c));
  const LayerRange lr = layout_.layers(c);
  auto acts_it = r.acts.find({c, mb});
  ATTNRES_CHECK(acts_it != r.acts.end(), "backward of chunk ", c, " microbatch ", mb,
                " without its forward");
  MbState& s = r.mbs.at(mb);

  model::DepthGrad g;
  if (c == C - 1) {
    g = std::move(r.head_grad.at(mb));
    r.head_grad.erase(mb);
    for (size_t j = 0; j < g.sources.size(); ++j) {
      ATTNRES_CHECK(!s.acc.count(static_cast<int64_t>(j)), "gradient of b_", j,
                    " accumulated before the head's backward");
      s.acc[static_cast<int64_t>(j)] = g.sources[j];
    }
  } else {
    unpack(boundary_message(layout_, plan_, c + 1, cache_), r.take({true, c, mb}, "gradient"),
           g.hidden, [&](int64_t j, Tensor v) {
             auto it = s.acc.find(j);
             if (it == s.acc.end())
               s.acc[j] = v;
             else
               kern::add_(it->second, v);
           }, g.partial);
  }

  const int64_t n0 = plan_.sources_after(lr.begin), n1 = plan_.sources_after(lr.end);
  if (plan_.attnres) {
    // The chunk's backward adds into the accumulators of every source it saw.
    g.sources.clear();
    for (int64_t j = 0; j < n1; ++j) {
      auto it = s.acc.find(j);
      if (it == s.acc.end()) {
        Tensor zero = new_tensor(1);
        zero.zero_();
        it = s.acc.emplace(j, zero).first;
      }
      g.sources.push_back(it->second);
    }
  }

  m.layers_backward(lr.begin, lr.end, acts_it->second, g);

  if (plan_.attnres) {
    ATTNRES_CHECK(static_cast<int64_t>(g.sources.size()) == n0, "chunk ", c,
                  ": depth gradient has ", g.sources.size(), " sources after backward, expected ",
                  n0);
    // Sources this chunk produced are finished: their gradients went into its sublayers.
    for (int64_t j = n0; j < n1; ++j) s.acc.erase(j);
  }

  if (c > 0) {
    // The gradient message to chunk c-1: the shape of the forward message into c.
    const BoundaryMessage bm = boundary_message(layout_, plan_, c, cache_);
    r.outgoing[{true, c, mb}] =
        pack(bm, g.hidden, [&](int64_t j) { return s.acc.at(j); }, g.partial, c);
    if (!bm.hidden)
      for (int64_t j = bm.lo; j < bm.hi; ++j) s.acc.erase(j);  // the receiver carries them on
  } else {
    m.embed_backward(acts_it->second, g);
    s.acc.erase(0);
  }
  r.acts.erase(acts_it);
  // Backwards of a chunk run in microbatch order: after the last one its
  // parameter gradients are final.
  if (mb == r.spec.M - 1 && r.grads_ready) r.grads_ready(layout_.local_index(c));

  if (c == model_.chunk_id(0)) {  // the microbatch's last backward on this rank
    ATTNRES_CHECK(s.acc.empty(), "microbatch ", mb, ": ", s.acc.size(),
                  " source gradients left on stage ", model_.stage(), " after its last backward");
    r.mbs.erase(mb);
  }
}

}  // namespace attnres::parallel
