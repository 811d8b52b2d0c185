#include "train/memory.h"


#include <algorithm>
#include <map>
#include <set>

#include "kernels/common.h"
#include "model/params.h"
#include "parallel/layout.h"
#include "parallel/schedule.h"
#include "parallel/zero.h"
#include "train/optimizer.h"

namespace attnres::train {

namespace {

// Live bytes and their high-water mark, with the named buffers seen.
class Tracker {
 public:
  void alloc(int64_t bytes) {
    live_ += bytes;
    peak_ = std::max(peak_, live_);
  }
  void free(int64_t bytes) { live_ -= bytes; }
  int64_t live() const { return live_; }
  int64_t peak() const { return peak_; }
  // Peak since the last mark, relative to the live bytes at the mark.
  void mark() { peak_ = live_; }

 private:
  int64_t live_ = 0, peak_ = 0;
};

// One chunk's forward and backward of one microbatch, replayed.
struct ChunkReplay {
  int64_t kept = 0;      // live at the end of the forward
  int64_t fwd_peak = 0;  // high-water during the forward, above its start
  int64_t bwd_peak = 0;  // high-water during the backward, above its start (kept included)
  // Of `kept`, what the executor's per-microbatch store takes over: the
  // sources the chunk completed (values and RMS statistics), and the head's
  // gradients of every source (accumulators). The rest goes at the end of
  // the chunk's backward.
  int64_t sources = 0, source_grads = 0;
  std::vector<Buffer> buffers;
};

class ChunkModel {
 public:
  // cudnn_attention: the attention backward may run cuDNN's fused attention
  // (training.attention_kernel auto or cudnn on cuda), whose workspace holds
  // fp32 row sums [B, H, T] and an fp32 dQ accumulator [N, H hd] while it
  // runs (kernels/cuda/attention_cudnn.cu; the engine's own part, unknown
  // before its plan is built, is not counted).
  // expert_parallel: parallel.expert > 1, whose MoE layers exchange their
  // rows with the expert group (Model::to_experts / from_experts). A member
  // then runs its experts over the rows the group routed to them: counted
  // as many as it sends (the balanced load; an expert that draws more rows
  // than its share makes that member's high-water larger).
  ChunkModel(const model::ModelConfig& m, model::Recompute r, int64_t N, DType act,
             bool cudnn_attention, bool expert_parallel)
      : m_(m), r_(r), N_(N), ep_(expert_parallel), e_(static_cast<int64_t>(dtype_size(act))),
        f_(static_cast<int64_t>(dtype_size(kernels::stat_dtype(act)))),
        attn_ws_(cudnn_attention ? N * m.n_heads * 4 + N * m.n_heads * m.head_dim() * 4 : 0) {}

  // Sublayers [s0, s1), with the embedding before them and the head after
  // them when the chunk has those.
  ChunkReplay replay(int64_t s0, int64_t s1, bool embed, bool head) const {
    const int64_t d = m_.d_model, F = m_.d_ff;
    const int64_t Nd = N_ * d * e_, Nf = N_ * f_;
    const bool ar = m_.attnres();
    const int64_t S = ar ? m_.resolved_block_size() : 0, G = ar ? m_.mix_group_size() : 1;
    const bool mix = r_ != model::Recompute::None, layer = r_ == model::Recompute::Layer;
    // A residual variant's one-pass Mix (groups of one, nothing merges): its
    // weights [N, H, k] and an input query's rows [N, d] per sublayer, both
    // dropped by recomputation and made again.
    const bool one_pass = m_.one_pass_mix();
    const int64_t H = one_pass ? m_.variant.heads : 1;
    const int64_t qrows = one_pass && m_.mix_form().logits == kernels::MixLogits::RowQueries ? Nd : 0;
    auto one_pass_drop = [&](int64_t s) { return one_pass ? N_ * H * m_.mix_sources(s) * f_ + qrows : 0; };
    // DenseFormer: the average before layer l >= 1 (its output and weights
    // [N, 1, l + 1]), dropped by recomputation; each layer's output a source.
    const bool dense = m_.denseformer();
    auto dwa_bytes = [&](int64_t s) { return dense && s % 2 == 0 && s > 0 ? N_ * (s / 2 + 1) * f_ + Nd : 0; };
    auto completes_source = [&](int64_t s) { return (ar && s % S == S - 1) || (dense && s % 2 == 1); };
    ChunkReplay out;
    // The largest single tensors: a sublayer's input/output, an MLP
    // intermediate, and (below) the largest Mix group's softmax weights.
    out.buffers = {{"[N, d] activation", Nd}, {"[N, d_ff] MLP intermediate", N_ * F * e_}};
    int64_t probs_max = 0;
    Tracker t;

    // What a sublayer's record holds after its forward, by recompute mode,
    // and what its f_s core allocates.
    auto core = [&](int64_t s) { return s % 2 == 0 ? attn(s / 2).record : mlp(s / 2).record; };
    auto fwd_tmp = [&](int64_t s) { return s % 2 == 0 ? attn(s / 2).fwd_tmp : mlp(s / 2).fwd_tmp; };
    auto norm_stats = [&](int64_t s) { return ar && m_.recent_sources(s) > 0 ? N_ * (2 * m_.recent_sources(s) + 2) * f_ : Nf; };
    auto dropped = [&](int64_t s) {  // what drop_recomputable frees
      if (!mix) return int64_t{0};
      int64_t b = Nd + norm_stats(s) + (ar ? Nd : 0) + one_pass_drop(s) + dwa_bytes(s);  // u, stats, phase-1 output
      if (s % 2 == 1) b += mlp(s / 2).mix_drop;
      if (layer) b += s % 2 == 0 ? attn(s / 2).record : mlp(s / 2).layer_drop;
      return b;
    };
    if (m_.has_moe())
      out.buffers.push_back({"[N K, d] MoE expert rows", moe_rows() * d * e_});

    // ---- forward ----
    if (embed) t.alloc(Nd + (ar || dense ? Nf : 0));  // e (b_0) and its rstd
    if (embed && (ar || dense)) out.sources += Nd + Nf;
    std::vector<int64_t> group_kept(static_cast<size_t>(s1 - s0), 0);  // leader's records
    for (int64_t s = s0; s < s1;) {
      const int64_t end = ar ? std::min((s / G + 1) * G, s1) : s + 1;
      const int64_t Q = end - s;
      int64_t lse = 0;
      if (ar) {
        bool merges = false;
        for (int64_t q = s; q < end; ++q) merges = merges || m_.recent_sources(q) > 0;
        const int64_t k = m_.phase1_sources(s);
        const int64_t probs = Q * N_ * H * k * f_, dlse = merges ? Q * Nf : 0;
        lse = merges ? Q * Nf : 0;
        t.alloc(probs + dlse + lse + Q * (Nd + qrows));  // weights, dlse, lse, the Q phase-1 outputs
        group_kept[static_cast<size_t>(s - s0)] = probs + dlse;
        probs_max = std::max(probs_max, probs);
      }
      for (; s < end; ++s) {
        t.alloc(dwa_bytes(s));                        // DenseFormer's average
        t.alloc(Nd + norm_stats(s));                  // u and its statistics
        t.alloc(core(s));                             // f_s up to its last projection
        t.alloc(fwd_tmp(s));                          // and its transient (MoE: the permuted rows)
        t.free(fwd_tmp(s));
        t.alloc(Nd);                                  // y (the new partial sum or stream)
        if (completes_source(s)) {                    // a completed block, and its rstd
          t.alloc(Nf);
          out.sources += Nd + Nf;
        }
        t.free(dropped(s));
      }
      t.free(lse);
    }
    if (head) {
      // Final Mix (one query over every source) + norm, LM head + loss and
      // its backward in the same call: dh, and the depth gradient it starts
      // (every source's, and the partial's), kept to the backward.
      const int64_t k = plan_.sources_after(m_.n_layers);
      const bool merge = plan_.partial_after(m_.n_layers);
      const int64_t acts = dense      ? N_ * (m_.n_layers + 1) * f_ + 2 * Nd + Nf
                           : one_pass ? N_ * H * m_.final_sources() * f_ + qrows + 2 * Nd + Nf
                           : ar     ? N_ * k * f_ + (merge ? 2 * Nf : 0) + Nd + Nd +
                                    (merge ? N_ * 4 * f_ : Nf)
                                    : Nd + Nf;  // probs, lse+dlse, o, u, stats | u, rstd
      t.alloc(acts);
      t.alloc(Nd);  // dh
      const int64_t grads = ar ? (k + (merge ? 1 : 0)) * Nd : dense ? (m_.n_layers + 1) * Nd : 0;
      out.source_grads = ar ? k * Nd : dense ? (m_.n_layers + 1) * Nd : 0;
      t.alloc(grads + Nd);  // depth gradient, d_o (the baseline's is its gradient)
      t.free(Nd);           // dh
      if (merge && !one_pass) t.free(Nf);  // lse, read by the merge
    }
    // Not the head's chunk: the last y leaves with the message (the
    // baseline's stream is the message; a partial sum is copied into it).
    if (!head && !dense && (!ar || plan_.partial_after(s1 / 2))) t.free(Nd);
    if (probs_max > 0) out.buffers.push_back({"[Q, N, k] Mix softmax weights", probs_max});
    out.fwd_peak = t.peak();
    out.kept = t.live();

    // ---- backward ----
    t.mark();
    int64_t pending_d_o = 0;
    for (int64_t s = s1 - 1; s >= s0; --s) {
      const int64_t lead = ar ? std::max(s / G * G, s0) : s;
      if (mix) {  // recompute: phase 1 alone (transient weights), norm, core
        const int64_t again = dropped(s);
        const int64_t alone = ar && !one_pass ? N_ * m_.phase1_sources(s) * f_ : 0;
        t.alloc(alone);
        t.alloc(again);
        t.free(alone);
      }
      // Gradient temporaries of f_s, then du; the norm backward writes d_o.
      const int64_t tmp = s % 2 == 0 ? attn(s / 2).bwd_tmp : mlp(s / 2).bwd_tmp;
      t.alloc(tmp + Nd);
      if (s % 2 == 0) {  // cuDNN's attention backward workspace, while it runs
        t.alloc(attn(s / 2).ws);
        t.free(attn(s / 2).ws);
      }
      t.free(tmp);
      if (ar) {
        t.alloc(Nd);  // d_o, held until the group's phase-1 backward
        pending_d_o += Nd;
      }
      t.free(Nd);  // du
      // The record goes (all but the leader's phase-1 record and d_o).
      t.free(Nd + norm_stats(s) + core(s) + (ar ? Nd + qrows : 0) + dwa_bytes(s));
      // y of the sublayer before is freed with this record's reference to it
      // (partial sums and the stream; completed blocks stay in the store).
      if (s > s0 && !completes_source(s - 1)) t.free(Nd);
      if (ar && s == lead) {
        t.free(group_kept[static_cast<size_t>(s - s0)] + pending_d_o);
        pending_d_o = 0;
      }
    }
    out.bwd_peak = t.peak();
    return out;
  }

 private:
  // An MLP sublayer's bytes: its record after the forward, the forward's
  // transient, what recompute mix and layer drop of the record, and the
  // backward's temporaries (Model::mlp_core / moe_core, mlp_backward /
  // moe_backward).
  struct MlpBytes {
    int64_t record = 0, fwd_tmp = 0, mix_drop = 0, layer_drop = 0, bwd_tmp = 0;
  };
  // An attention sublayer's bytes, by its kind: the record after the
  // forward (recompute layer drops all of it, mix none), the forward's
  // transient, the backward's temporaries and (GQA on cuda) cuDNN's
  // workspace. Each is what its layer file allocates with Tensor::empty
  // (model/attention.cpp, kda_layer.cpp, mla_layer.cpp); the CPU kernels'
  // own scratch is not counted.
  struct AttnBytes {
    int64_t record = 0, fwd_tmp = 0, bwd_tmp = 0, ws = 0;
  };
  AttnBytes attn(int64_t l) const {
    const int64_t N = N_, e = e_, f = f_;
    if (m_.kda_layer(l)) {
      // pq, pk, pv, cq, ck, cv, qn, kn, f, g, core, z, gated [N, H K]; fa,
      // ga [N, K]; beta [N, H]; beta's logits [N, H] transient. Backward:
      // dgated, dcore, dz, dqn, dkn, dcv, dg, df, dc, dp [N, H K]; dga, dfa
      // [N, K]; dbeta, dbl [N, H].
      const int64_t H = m_.kda.heads, K = m_.kda.head_dim, HK = H * K;
      return {N * e * (13 * HK + 2 * K + H), N * e * H, N * e * (10 * HK + 2 * K + 2 * H), 0};
    }
    if (m_.mla_layer(l)) {
      // c_kv, its norm [N, r] and rstd [N]; the expanded q | k | v
      // [N, H (2 (dn + dr) + dv)], att [N, H dv], lse [N, H]. Forward's
      // transient: q [N, H (dn + dr)], k_r [N, dr], [k_n | v] [N, H (dn + dv)].
      // Backward: datt, dqkv, dq, dkv, dkr, dcn, dckv.
      const model::MlaConfig& a = m_.mla;
      const int64_t H = m_.n_heads, qk = H * (a.qk_nope_head_dim + a.qk_rope_head_dim);
      const int64_t vw = H * a.v_head_dim, kvb = H * a.qk_nope_head_dim + vw;
      const int64_t r = a.kv_lora_rank, dr = a.qk_rope_head_dim, qkv = 2 * qk + vw;
      return {N * e * (2 * r + qkv + vw) + N * f * (1 + H), N * e * (qk + dr + kvb),
              N * e * (vw + qkv + qk + kvb + dr + 2 * r), 0};
    }
    // GQA: q and att [N, H hd], k and v [N, Hkv hd], lse [N, H]; backward
    // datt and the joint dq | dk | dv.
    const int64_t d = m_.d_model, kv = m_.n_kv_heads * m_.head_dim();
    return {2 * N * d * e + 2 * N * kv * e + N * m_.n_heads * f, 0,
            2 * N * d * e + 2 * N * kv * e, attn_ws_};
  }
  // A MoE layer's routed rows: N K slots (dropless), or at most E C kept.
  int64_t moe_rows() const {
    const model::MoeConfig& moe = m_.moe;
    const int64_t slots = N_ * moe.top_k, C = m_.moe_capacity(N_);
    return C > 0 ? std::min(slots, moe.experts * C) : slots;
  }
  MlpBytes mlp(int64_t l) const {
    const int64_t d = m_.d_model, F = m_.d_ff;
    if (!m_.moe_layer(l)) return {3 * N_ * F * e_, 0, N_ * F * e_, 2 * N_ * F * e_, 3 * N_ * F * e_};
    // Routing: logits [N, E] and gate weights [N, K] in the statistics'
    // dtype, slot experts and rows [N, K] and the rows' tokens [M] as I32.
    // Shared experts: gu [N, 2 Fs], h [N, Fs]. Routed: gu [M, 2 Fe],
    // h [M, Fe], y [M, d]; the permuted input x [M, d] is transient.
    const model::MoeConfig& moe = m_.moe;
    const int64_t E = moe.experts, K = moe.top_k, Fe = moe.expert_d_ff;
    const int64_t Fs = moe.shared_experts * Fe, M = moe_rows();
    const int64_t routing = N_ * E * f_ + N_ * K * (f_ + 8) + M * 4;
    MlpBytes b;
    b.record = routing + 3 * N_ * Fs * e_ + 3 * M * Fe * e_ + M * d * e_;
    b.fwd_tmp = M * d * e_;
    b.mix_drop = N_ * Fs * e_ + M * Fe * e_;                        // both h
    b.layer_drop = 2 * N_ * Fs * e_ + 2 * M * Fe * e_ + M * d * e_;  // both gu, the rows' y
    // Shared dh [N, Fs]; dgate [N, K] and dlogits [N, E]; the rows' dy, x,
    // dx [M, d], dh [M, Fe], dgu [M, 2 Fe].
    b.bwd_tmp = N_ * Fs * e_ + N_ * (K + E) * f_ + 3 * M * d * e_ + 3 * M * Fe * e_;
    if (ep_) {
      // The received rows x [M, d] are kept for backward (not permuted
      // again), and recompute layer drops them; the exchanges' copies (rows
      // received, then regrouped; outputs regrouped, then returned) are
      // transient, two [M, d] at a time, in forward and backward alike.
      b.record += M * d * e_;
      b.layer_drop += M * d * e_;
      b.fwd_tmp += 2 * M * d * e_;
      b.bwd_tmp += 2 * M * d * e_;
    }
    return b;
  }

  model::ModelConfig m_;
  parallel::DepthPlan plan_ = parallel::DepthPlan::of(m_);
  model::Recompute r_;
  int64_t N_;
  bool ep_;
  int64_t e_, f_;
  int64_t attn_ws_;
};

}  // namespace

std::vector<RankMemory> plan_memory(const Config& cfg) {
  const model::ModelConfig& m = cfg.model;
  const TrainingConfig& tc = cfg.training;
  const int P = static_cast<int>(cfg.parallel.pipeline), V = static_cast<int>(cfg.parallel.virtual_stages);
  const int M = static_cast<int>(tc.grad_accum);
  const int64_t N = tc.micro_batch_size * tc.seq_len;
  const bool bf16 = tc.precision == DType::BF16;
  const DType act = tc.precision;
  const int64_t e = static_cast<int64_t>(dtype_size(act));
  const parallel::PipelineLayout layout(m.n_layers, P, V, cfg.parallel.layers_per_chunk);
  const auto plan = parallel::DepthPlan::of(m);
  const int C = layout.C();
  const bool cudnn_attention =
      tc.device == Device::CUDA && tc.attention_kernel != kernels::AttentionKernel::Own;
  const int64_t EP = cfg.parallel.expert, D_all = cfg.parallel.data;
  const ChunkModel chunk_model(m, tc.recompute, N, act, cudnn_attention, EP > 1);
  const auto lists = parallel::pipeline_schedule({P, V, M, false});

  std::vector<RankMemory> out;
  for (int p = 0; p < P; ++p) {
    RankMemory r;
    r.stage = p;
    r.replica_resident.assign(static_cast<size_t>(D_all), 0);
    std::map<int, ChunkReplay> replay;
    for (int c : layout.chunks_of(p)) {
      model::ModelParts parts;
      parts.layer_begin = layout.layers(c).begin;
      parts.layer_end = layout.layers(c).end;
      parts.embedding = c == 0;
      parts.head = c == C - 1;
      if (EP > 1) parts.expert_end = m.moe.experts / EP;  // E / EP routed experts per member
      // Optimizer state: AdamW's two moments per element, Muon's one buffer
      // per element of the matrices it takes (optimizer.type = muon); the
      // routed experts' apart (with EP > 1 their own ZeRO-1 spaces), and the
      // tensors kept at full precision (the routers: fp32 values, no master;
      // with ZeRO-1 a space of their own).
      const bool muon = cfg.optimizer.type == OptimizerType::Muon;
      struct Group {
        int64_t n = 0, sliced = 0;  // all elements; those sliced by ZeRO-1
        std::vector<Shape> whole;   // Muon's matrices
      } g[3];
      for (const auto& s : model::param_shapes(m, parts)) {
        Group& k = g[s.full_precision && bf16 ? 2 : EP > 1 && s.expert >= 0];
        k.n += s.numel();
        if (muon && Optimizer::takes_muon(s.name, static_cast<int>(s.shape.size())))
          k.whole.push_back(s.shape);
        else
          k.sliced += s.numel();
      }
      // ZeRO-1: the optimizer keeps the moments (and in a bf16 run the fp32
      // masters) of its slice of each sliced space only (the chunk's over the
      // D replicas, its experts' over the D / EP holding them), and of the
      // Muon matrices it owns (parallel/zero.h): each space's largest owner's
      // in r's fields, and every replica's own in replica_resident.
      for (size_t k = 0; k < 3; ++k) {
        const int D = cfg.parallel.zero == 1 ? static_cast<int>(k == 1 ? D_all / EP : D_all) : 1;
        const bool low = bf16 && k != 2;  // bf16 values, fp32 masters
        int64_t owned_whole = 0;
        std::vector<int64_t> block(static_cast<size_t>(D), 0);
        const auto owners = parallel::whole_owners(g[k].whole, D);
        for (size_t i = 0; i < owners.size(); ++i) {
          int64_t e = 1;
          for (int64_t dim : g[k].whole[i]) e *= dim;
          block[static_cast<size_t>(owners[i])] += e;
        }
        if (!block.empty()) owned_whole = *std::max_element(block.begin(), block.end());
        const int64_t slice = (g[k].sliced + D - 1) / D;
        r.weights += g[k].n * (low ? 2 : 4);
        r.master += low ? (slice + owned_whole) * 4 : 0;
        r.grads += g[k].n * 4;
        r.optimizer += slice * 8 + owned_whole * 4;
        // Replica d by itself: member d of the space (d / EP of the experts'
        // holders; 0 without ZeRO-1).
        for (int64_t d = 0; d < D_all; ++d) {
          const int64_t member = D == 1 ? 0 : k == 1 ? d / EP : d;
          const int64_t own = block.empty() ? 0 : block[static_cast<size_t>(member)];
          r.replica_resident[static_cast<size_t>(d)] +=
              g[k].n * (low ? 2 : 4) + g[k].n * 4 + (low ? (slice + own) * 4 : 0) + slice * 8 + own * 4;
        }
      }
      replay[c] = chunk_model.replay(2 * parts.layer_begin, 2 * parts.layer_end, c == 0,
                                     c == C - 1);
      r.kept_per_microbatch.push_back(replay[c].kept);
      r.in_flight.push_back(0);
    }
    // The action list, as the executor runs it (parallel/executor.cpp): a
    // forward adds its chunk's record; the sources a microbatch's chunks
    // complete or receive, and the gradient accumulators of the sources it
    // saw, stay in the microbatch's store until its last backward here (less
    // what the gradient messages carry back); messages live from their
    // receive to their use.
    const int64_t Nd = N * m.d_model * e;
    const int64_t Nf = N * static_cast<int64_t>(dtype_size(kernels::stat_dtype(act)));
    auto bm = [&](int into) {
      return parallel::boundary_message(layout, plan, into, cfg.parallel.cache_blocks);
    };
    auto msg = [&](int into) { return bm(into).tensors() * Nd; };
    struct Store {
      std::set<int64_t> acc;   // source ids with a gradient accumulator here
      int64_t bytes = 0;       // sources and received messages held
    };
    std::map<int, Store> store;  // by microbatch
    Tracker t;
    std::map<int, int> held;  // chunk -> microbatches held
    // A packed message is released once its send completed, which the
    // executor sees between computes: count it through the next compute. In
    // a CUDA graph (training.cuda_graphs) every send completes at the step's
    // end (parallel/step_graph.h): its buffer is held until then.
    const bool held_to_end = cfg.cuda_graphs();
    int64_t sending = 0;
    auto sent = [&](int64_t bytes) {
      if (!held_to_end) t.free(sending);
      sending = bytes;
      t.alloc(bytes);
    };
    for (const auto& a : lists[static_cast<size_t>(p)]) {
      const ChunkReplay* rep = replay.count(a.chunk) ? &replay.at(a.chunk) : nullptr;
      Store& st = store[a.mb];
      switch (a.op) {
        case parallel::Op::RecvAct:  // its sources stay in the store
          t.alloc(msg(a.chunk));
          st.bytes += msg(a.chunk);
          break;
        case parallel::Op::RecvGrad:  // used by the backward of a.chunk
          t.alloc(msg(a.chunk + 1));
          break;
        case parallel::Op::SendAct:
        case parallel::Op::SendGrad:
          break;  // the packed buffer is released once the send completes (below)
        case parallel::Op::Forward: {
          t.alloc(rep->fwd_peak);
          t.free(rep->fwd_peak - rep->kept);
          if (a.chunk > 0 && plan.attnres) {  // received sources get their rstd here
            const auto b = bm(a.chunk);
            t.alloc((b.hi - b.lo) * Nf);
            st.bytes += (b.hi - b.lo) * Nf;
          }
          st.bytes += rep->sources;
          if (rep->source_grads > 0)
            for (int64_t j = 0; j < plan.sources_after(m.n_layers); ++j) st.acc.insert(j);
          st.bytes += rep->source_grads;
          sent(a.chunk < C - 1 ? msg(a.chunk + 1) : 0);
          const int v = layout.local_index(a.chunk);
          r.in_flight[static_cast<size_t>(v)] =
              std::max(r.in_flight[static_cast<size_t>(v)], ++held[a.chunk]);
          break;
        }
        case parallel::Op::Backward: {
          const auto lr = layout.layers(a.chunk);
          const int64_t n0 = plan.sources_after(lr.begin), n1 = plan.sources_after(lr.end);
          int64_t in_msg = 0;  // the gradient message's bytes still needed
          if (a.chunk < C - 1) {
            in_msg = msg(a.chunk + 1);
            if (plan.attnres) {  // its source gradients become accumulators, or add into them
              const auto b = bm(a.chunk + 1);
              for (int64_t j = b.lo; j < b.hi; ++j)
                if (st.acc.insert(j).second) {
                  st.bytes += Nd;
                  in_msg -= Nd;
                }
            }
          }
          for (int64_t j = 0; j < n1; ++j)  // zero accumulators for the rest it saw
            if (st.acc.insert(j).second) {
              t.alloc(Nd);
              st.bytes += Nd;
            }
          const int64_t own = rep->kept - rep->sources - rep->source_grads;
          t.alloc(rep->bwd_peak - rep->kept);
          t.free(rep->bwd_peak - rep->kept + own + in_msg);
          auto drop = [&](int64_t j) {
            if (st.acc.erase(j)) {
              t.free(Nd);
              st.bytes -= Nd;
            }
          };
          for (int64_t j = n0; j < n1; ++j) drop(j);  // produced here: finished
          sent(a.chunk > 0 ? msg(a.chunk) : 0);
          if (a.chunk > 0) {  // the gradient message to chunk c-1 carries some on
            if (plan.attnres)
              for (int64_t j = bm(a.chunk).lo; j < bm(a.chunk).hi; ++j) drop(j);
          }
          --held[a.chunk];
          if (a.chunk == layout.chunks_of(p).front()) {  // its last backward here
            t.free(st.bytes);
            store.erase(a.mb);
          }
          break;
        }
      }
    }
    r.activations = t.peak();
    // The rank's largest single tensors: its chunks' and its largest message.
    for (const auto& [c, rep] : replay) {
      for (const Buffer& b : rep.buffers) {
        auto it = std::find_if(r.largest.begin(), r.largest.end(),
                               [&](const Buffer& x) { return x.what == b.what; });
        if (it == r.largest.end()) r.largest.push_back(b);
        else it->bytes = std::max(it->bytes, b.bytes);
      }
      if (c > 0) r.largest.push_back({"message into chunk " + std::to_string(c), msg(c)});
    }
    std::sort(r.largest.begin(), r.largest.end(),
              [](const Buffer& a, const Buffer& b) { return a.bytes > b.bytes; });
    r.largest.resize(std::min<size_t>(r.largest.size(), 4));
    out.push_back(std::move(r));
  }
  return out;
}

int64_t largest_fitting(int64_t lo, int64_t step, const std::function<bool(int64_t)>& fits,
                        int64_t hi) {
  ATTNRES_CHECK(step > 0 && hi >= lo, "largest_fitting: step ", step, ", bound ", hi, ", start ", lo);
  hi = lo + (hi - lo) / step * step;  // the last value of the search's grid
  if (!fits(lo)) return lo - step;
  if (hi == lo) return lo;
  int64_t good = lo, bad = lo + step;
  while (fits(bad)) {
    good = bad;
    if (good == hi) return hi;
    bad = std::min(lo + 2 * (bad - lo), hi);
  }
  while (bad - good > step) {
    const int64_t mid = good + (bad - good) / 2 / step * step;
    (fits(mid) ? good : bad) = mid;
  }
  return good;
}

}  // namespace attnres::train
