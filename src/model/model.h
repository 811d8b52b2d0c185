// The transformer with the three residual modes of docs/model.md, organised as
// embedding -> chunks of layers over a DepthState -> head. A single process
// runs one chunk holding every layer; the pipeline runtime splits the layers
// into chunks and moves DepthStates between ranks. The forward pass of a chunk
// stores what its backward needs in an Activations record owned by the caller,
// so any number of microbatches can be in flight.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "core/span.h"
#include "core/tensor.h"
#include "kernels/attention.h"
#include "kernels/moe.h"
#include "kernels/store.h"
#include "model/config.h"
#include "model/depth_state.h"
#include "model/kda_layer.h"
#include "model/mla_layer.h"
#include "model/params.h"

namespace attnres::model {

// Saved tensors of one sublayer (attention or MLP).
//
// AttnRes modes run the depth Mix in two phases (kernels/mix.h): the
// consecutive sublayers of one Mix group (ModelConfig::mix_group_size) inside
// one chunk form a group whose first sublayer (the leader) runs phase 1 for
// all of them, over the sources that existed when the Mix group started; each
// sublayer with recent sources (added since) then merges them in. The leader
// keeps the group's phase-1 record.
struct SublayerActs {
  // Group leader: the completed sources read, their RMS stats, the softmax
  // weights [Q, N, k], and dL/dlse [Q, N] (rows of merging sublayers are
  // written by their backward, the others zeroed by the phase-1 backward;
  // undefined when no sublayer merges).
  int64_t group_size = 0;  // Q for a leader, 0 otherwise
  std::vector<Tensor> mix_sources, mix_rstd;
  Tensor mix_probs, mix_dlse;
  // Every AttnRes sublayer: its phase-1 output o; with a merge, also its
  // lse [N] (a row of the leader's, until the merge has read it), the m
  // recent sources it merged (later sources, then the partial sum), the
  // merge + norm statistics [N, 2m + 2] and its row of the leader's dlse (x
  // and norm_rstd stay undefined: the merge op normalises).
  std::vector<Tensor> mix_recent;
  Tensor mix_o, mix_lse, mix_stats, mix_dlse_row;
  // A residual variant's one-pass Mix (ModelConfig::one_pass_mix) instead:
  // mix_sources holds the sources it read, mix_probs its weights [N, H, k]
  // and mix_q an input query's rows q = W_l v [N, d]; x is its output.
  Tensor mix_q;
  Tensor d_o;         // backward: dL/do, for the leader's phase-1 backward
  Tensor x;           // sublayer input (phase-1 output, or the baseline stream)
  Tensor norm_rstd;   // RMSNorm statistics of x
  Tensor u;           // RMSNorm(x; g)
  // attention: q | k (after RoPE) | v in one [N, (H + 2 Hkv) hd] tensor
  // (kernels/attention.h), the attention output and its log-sum-exp
  Tensor qkv, att, lse;
  // a KDA layer's attention (model.kda) instead: model/kda_layer.h; an MLA
  // layer's (model.mla): model/mla_layer.h
  KdaActs kda;
  MlaActs mla;
  // MLP: the joint gate/up projection [N, 2F] (gate | up) and SwiGLU output
  // (a MoE layer: its shared experts', when it has them)
  Tensor gu, h;
  // MoE MLP: the router's logits [N, E] (statistics' dtype), the routing
  // (kept under every recompute setting: it is small, and routing again would
  // count the loads twice), and the routed experts' rows: their gate | up
  // [M, 2Fe], SwiGLU output [M, Fe] and output [M, d] (the combine's input).
  //
  // The routed experts held here run on "their rows": local expert j's are
  // rows [moe_offsets[j], moe_offsets[j + 1]) of moe_gu and moe_h. Without
  // expert parallelism those are the routing's own rows (moe_offsets =
  // moe_route.offsets). With it (ExpertExchange), every member of the expert
  // group sends the rows routed to each member's experts and receives the
  // rows of its own: moe_counts[p * El + j] rows from member p for local
  // expert j (kept with the routing), regrouped by expert; moe_x keeps them
  // for backward, and moe_y holds the outputs back in the routing's order.
  Tensor moe_logits;
  kernels::MoeRouting moe_route;
  std::vector<int64_t> moe_counts, moe_offsets;
  Tensor moe_x, moe_gu, moe_h, moe_y;
};

// Expert parallelism (parallel.expert = EP; docs/parallel.md "Expert
// parallelism"): each member of a group of EP replicas holds E / EP
// consecutive routed experts of every MoE layer (ModelParts::expert_begin),
// routes its own tokens over all E and sends each row to the member holding
// its expert. What the model needs from the runtime (parallel/expert_exchange.h);
// every member calls these at the same point of the same schedule.
class ExpertExchange {
 public:
  virtual ~ExpertExchange() = default;
  virtual int members() const = 0;  // EP
  // mine [EP * k]: k counts for each member q at [q * k, (q + 1) * k);
  // returns what each member p sent this one, at [p * k, (p + 1) * k).
  virtual std::vector<int64_t> counts(const std::vector<int64_t>& mine) = 0;
  // Rows of `send` [*, c]: send_rows[q] consecutive ones to member q; rows
  // from member p (recv_rows[p] of them) into `recv`, in member order.
  virtual void rows(const Tensor& send, const std::vector<int64_t>& send_rows, Tensor& recv,
                    const std::vector<int64_t>& recv_rows) = 0;
};

// Everything one microbatch's forward through a chunk saved for backward.
struct Activations {
  int64_t B = 0, T = 0;
  // dL/d(summed token loss) of the step this forward belongs to (grad_scale:
  // 1 / the step's tokens): the weight of a MoE auxiliary loss's gradient.
  double loss_scale = 0;
  Tensor tokens;                      // embedding chunk only
  int64_t first_sublayer = 0;
  std::vector<SublayerActs> sub;      // in forward order
  // head: its input (final Mix: a group of one query over the completed
  // sources, merged with the unfinished block's partial sum when
  // 2L % S != 0; or the stream) and the final norm, recorded as a sublayer's
  SublayerActs head;
};

// Per-sublayer statistics for the depth analysis (the paper's Figure 5 view),
// indexed by global sublayer s: sums of squares of every sublayer output y_s
// and of its gradient dL/dy_s (L = the loss the backward pass was started
// with, i.e. scaled by grad_scale), with the number of elements summed. They
// accumulate over the microbatches a sink stays attached; a pipeline rank
// fills only its own sublayers (the others stay zero, so sums over ranks
// combine them). RMS(y_s) = sqrt(output_sumsq / output_count) and
// ||dL/dy_s|| = sqrt(grad_sumsq).
struct DepthStats {
  std::vector<double> output_sumsq, output_count, grad_sumsq, grad_count;

  explicit DepthStats(int64_t n_sublayers = 0) { reset(n_sublayers); }
  void reset(int64_t n_sublayers) {
    const size_t n = static_cast<size_t>(n_sublayers);
    output_sumsq.assign(n, 0.0);
    output_count.assign(n, 0.0);
    grad_sumsq.assign(n, 0.0);
    grad_count.assign(n, 0.0);
  }
};

// Per MoE layer (indexed by global layer l; the other layers stay zero),
// summed over the microbatches of training steps while a sink is attached:
// each expert's load (the slots that chose it, dropped ones included), the
// slots dropped past an expert's capacity, the tokens routed, and the
// auxiliary loss (aux_loss balancing: aux_loss_coef E sum_e f_e P_e per
// microbatch) with its count of microbatches. A pipeline rank fills its own
// layers: sums over ranks combine them, as DepthStats.
struct MoeStats {
  int64_t experts = 0;
  std::vector<double> load;  // [n_layers * experts]
  std::vector<double> dropped, tokens, aux_sum, aux_count;  // [n_layers]

  MoeStats(int64_t n_layers = 0, int64_t n_experts = 0) { reset(n_layers, n_experts); }
  void reset(int64_t n_layers, int64_t n_experts) {
    experts = n_experts;
    const size_t n = static_cast<size_t>(n_layers);
    load.assign(n * static_cast<size_t>(n_experts), 0.0);
    for (auto* v : {&dropped, &tokens, &aux_sum, &aux_count}) v->assign(n, 0.0);
  }
};

// Per-layer key/value caches for incremental decoding of one sequence.
struct DecodeCache {
  // per layer [1, max_len, Hkv*hd] (an MLA layer's: model/mla_layer.h,
  // MlaCache; undefined for a KDA layer)
  std::vector<Tensor> k, v;
  std::vector<KdaCache> kda;  // per layer: a KDA layer's state and windows (others empty)
  int64_t pos = 0;           // tokens consumed so far
  int64_t max_len = 0;
};

class Model {
 public:
  // dtype/device: F32 or F64 on the cpu; F32 or BF16 (mixed precision, see
  // Param) on cuda. Everything the model allocates lives on `device`.
  Model(const ModelConfig& cfg, DType dtype = DType::F32, const ModelParts& parts = {},
        Device device = Device::CPU);
  // w_ points into params_ and state_: a copy would point into the original.
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;
  Model(Model&&) = default;  // moving params_ keeps its elements where they are
  Model& operator=(Model&&) = delete;

  const ModelConfig& config() const { return cfg_; }
  ParamTable& params() { return params_; }
  const ParamTable& params() const { return params_; }
  // The model state that is no parameter (the MoE routers' biases): saved,
  // loaded and initialised with the parameters, never trained.
  ParamTable& state() { return state_; }
  const ParamTable& state() const { return state_; }
  // Both: what checkpoints, initialisation and exports go through.
  std::vector<ParamTable*> tables() { return {&params_, &state_}; }
  // The same parameters by role (embedding, per-layer, head), not by name.
  const ModelParams& handles() const { return w_; }
  DType dtype() const { return dtype_; }
  Device device() const { return device_; }

  // ---- chunked API (pipeline building blocks) ----
  // Start a depth state from tokens I32 [B*T] (on any device).
  void embed_forward(const Tensor& tokens, int64_t B, int64_t T, DepthState& st,
                     Activations& acts) const;
  // Run layers [l0, l1) on `st` in place.
  void layers_forward(int64_t l0, int64_t l1, DepthState& st, Activations& acts) const;
  // Final Mix + norm + LM head + cross-entropy: the summed token loss.
  double head_loss(const DepthState& st, const Tensor& targets, Activations& acts);
  // The same, and the head's backward in one pass (the fused LM head +
  // cross-entropy makes both at once): parameter gradients accumulate and
  // `grad` receives dL/d(state) for loss * grad_scale. Returns the summed loss.
  double head_forward_backward(const DepthState& st, const Tensor& targets, Activations& acts,
                               DepthGrad& grad, double grad_scale);
  // Backward through layers [l0, l1) (the same range as the forward that made `acts`).
  void layers_backward(int64_t l0, int64_t l1, Activations& acts, DepthGrad& grad);
  void embed_backward(const Activations& acts, DepthGrad& grad);

  // ---- whole model in one process ----
  // Forward + backward of one microbatch: returns the summed token loss and
  // accumulates parameter gradients of loss_sum * grad_scale.
  double forward_backward(const Tensor& tokens, const Tensor& targets, int64_t B, int64_t T,
                          double grad_scale);
  double forward_loss(const Tensor& tokens, const Tensor& targets, int64_t B, int64_t T);

  // ---- per-token log-probabilities (scoring, evaluation tasks) ----
  // Implemented in model/logprobs.cpp. From the head's input state `st` (a
  // chunk holding the head): log p(targets[i] | position rows[i]) for the
  // selected positions (rows of the B*T batch) only. The logits of those
  // rows are computed in fp32 (from the fp32 master weights on a bf16 run)
  // and normalised in double on the host, so a scoring pass costs the
  // model's forward plus n x V logits, never B*T x V.
  std::vector<double> head_logprobs(const DepthState& st, const std::vector<int64_t>& rows,
                                    const std::vector<int32_t>& targets, Activations& acts) const;
  // The whole model in one process: the forward pass of tokens I32 [B*T]
  // (sequence b = tokens [b*T, b*T + T)), then head_logprobs.
  std::vector<double> forward_logprobs(const Tensor& tokens, int64_t B, int64_t T,
                                       const std::vector<int64_t>& rows,
                                       const std::vector<int32_t>& targets) const;

  // ---- generation ----
  DecodeCache new_decode_cache(int64_t max_len) const;
  // Feed the next token of a sequence; returns the logits [V] for the token after it.
  // Uses the same sublayer and residual code as training, with attention over
  // the cache instead of the whole sequence.
  std::vector<float> decode_step(int32_t token, DecodeCache& cache) const;

  // Attach a DepthStats sink (sized n_sublayers) that every forward and
  // backward pass through the sublayers adds to, or detach it with nullptr
  // (the trainer attaches it around the training steps it logs, not around
  // evaluation). Observing only: the computed numbers are the same with or
  // without it, and without one the cost is a null check per sublayer.
  void set_depth_stats(DepthStats* sink) { depth_stats_ = sink; }
  // The same for the MoE layers' routing (a sink sized by n_layers and
  // moe.experts): the trainer keeps one attached over its training steps; it
  // feeds the balancing bias and the logs.
  void set_moe_stats(MoeStats* sink) { moe_stats_ = sink; }
  // Expert parallelism: the exchange with the expert group (not owned), for
  // a model made with the parts' experts (ModelParts::expert_begin/end, E /
  // EP of them); nullptr (the default): this model holds every expert.
  void set_expert_exchange(ExpertExchange* x) { exchange_ = x; }
  // Auxiliary-loss-free balancing (model.moe.balance = aux_free), after an
  // optimizer step: for each MoE layer held here, b_e += rate sign(mean
  // load - load_e), from a step's loads summed over its global batch. The
  // bias range [min, max] of each layer held is written to lo and hi
  // (indexed by global layer; the others left as they are).
  void update_router_bias(const MoeStats& step, double rate, std::vector<double>& lo,
                          std::vector<double>& hi);
  // What layers_forward keeps for layers_backward (see Recompute).
  void set_recompute(Recompute r) { recompute_ = r; }
  Recompute recompute() const { return recompute_; }
  // The dtype of the LM head's logits in the training loss (head_loss,
  // head_forward_backward; training.logits): F32 (the default), or BF16 for a
  // BF16 model (kernels/cross_entropy.h). Scoring (head_logprobs) keeps fp32.
  void set_logits(DType logits);
  DType logits() const { return logits_; }
  // Which attention runs on CUDA in training (training.attention_kernel;
  // kernels/attention.h): Own (the default: scoring, evaluation, generation),
  // Auto or Cudnn. The CPU always runs its own kernels.
  void set_attention_kernel(kernels::AttentionKernel k) { attention_kernel_ = k; }

 private:
  // Sublayers [s0, s1) on `st`; subs[s - s0] receives sublayer s's record.
  void sublayers_forward(int64_t s0, int64_t s1, DepthState& st, std::vector<SublayerActs>& subs,
                         int64_t B, int64_t T, DecodeCache* cache = nullptr) const;
  // Phase 1 of the group g[0..Q) (sublayers s, s + 1, ...) over the first
  // cfg_.phase1_sources(s) of st's sources.
  void mix_phase1_forward(int64_t s, Span<SublayerActs> g, const DepthState& st) const;
  void mix_phase1_backward(int64_t s, Span<SublayerActs> g, DepthGrad& grad);
  // Phase 1 of the group g[0..Q) of queries ws over the first k of st's
  // sources; merging[q]: whether g[q] merges recent sources afterwards (it
  // then reads lse, and its backward writes its row of dlse). The backward
  // adds into the first k source gradients (writes them with Store::Set: the
  // head's, the first backward to reach them) and the queries' gradients.
  void phase1_forward(Span<SublayerActs> g, Span<const Tensor> ws, int64_t k,
                      const std::vector<bool>& merging, const DepthState& st) const;
  void phase1_backward(Span<SublayerActs> g, Span<Param* const> queries, DepthGrad& grad,
                       kernels::Store sources_store = kernels::Store::Add);
  // The input norm of a sublayer or the head: a.u = RMSNorm(x; gain), x being
  // the merge of a.mix_o with a.mix_recent (one op, query w) when there are
  // recent sources, else a.x. Its backward from du: with `stream` (baseline)
  // stream += dL/dx; else a.d_o written and, after a merge, a.mix_dlse_row
  // written and drecent += (query's gradient too; drecent = with Store::Set).
  void norm_forward(SublayerActs& a, const Tensor* w, const Tensor& gain) const;
  void norm_backward(SublayerActs& a, const Tensor& du, Param* query, Param& gain,
                     Span<Tensor> drecent, Tensor* stream,
                     kernels::Store drecent_store = kernels::Store::Add);
  void sublayer_forward(int64_t s, DepthState& st, SublayerActs& a, int64_t B, int64_t T,
                        DecodeCache* cache = nullptr) const;
  // A residual variant's Mix (model/residual_variants.cpp): the sources a
  // Mix reads from a state (its sources, then the partial sum; with a depth
  // window only the embedding and the window's), and the gradients of the
  // same from a depth gradient; a.x = the Mix of a.mix_sources with the
  // Mix's parameter p, and its backward from a.d_o.
  std::vector<Tensor> one_pass_sources(const DepthState& st) const;
  std::vector<Tensor> one_pass_sources(const DepthGrad& g) const;
  void one_pass_forward(SublayerActs& a, const Param& p) const;
  void one_pass_backward(SublayerActs& a, Param& p, Span<Tensor> dsources);
  // h = RMSNorm(z; g_final) of the final Mix z over all sources (AttnRes) or
  // of the stream (baseline); fills acts for the backward pass.
  Tensor final_norm(const DepthState& st, Activations& acts) const;
  void sublayer_backward(int64_t s, SublayerActs& a, DepthGrad& g, const Activations& acts);
  // Recompute: what a sublayer's record drops after its forward, and how its
  // backward gets it back (`leader`: the record of its Mix group's leader in
  // this chunk, which kept the phase-1 sources and weights).
  void drop_recomputable(SublayerActs& a) const;
  void recompute_sublayer(int64_t s, SublayerActs& a, const SublayerActs& leader, int64_t B,
                          int64_t T) const;
  // f_s: from the sublayer input x to its output y (both [N, d]), plus
  // `residual` when given (added by the last projection). The cores run f_s
  // up to the input of its last projection (what recomputation redoes).
  void attention_forward(int64_t l, SublayerActs& a, Tensor& y, int64_t B, int64_t T,
                         DecodeCache* cache, const Tensor* residual) const;
  void attention_core(int64_t l, SublayerActs& a, int64_t B, int64_t T, DecodeCache* cache) const;
  void mlp_core(int64_t l, SublayerActs& a) const;
  // Backward of f_s from dy to du, the gradient of the normalised input u.
  Tensor attention_backward(int64_t l, SublayerActs& a, const Tensor& dy, int64_t B, int64_t T);
  void mlp_forward(int64_t l, SublayerActs& a, Tensor& y, const Tensor* residual) const;
  Tensor mlp_backward(int64_t l, SublayerActs& a, const Tensor& dy, double loss_scale);
  // A MoE layer's MLP (model.moe): the core routes (once: the routing is
  // kept) and runs the shared and routed experts up to their outputs; the
  // output adds the shared experts' down projection and the routed outputs,
  // weighted, to `residual` (or to 0) in expert order.
  void moe_core(int64_t l, SublayerActs& a) const;
  void moe_output(int64_t l, SublayerActs& a, Tensor& y, const Tensor* residual) const;
  Tensor moe_backward(int64_t l, SublayerActs& a, const Tensor& dy, double loss_scale);
  kernels::MoeRouteOptions moe_route_options(int64_t N) const;
  // Rows [M, c] in the routing's order -> the rows of the experts held here
  // (moe_offsets), and back; the identity without expert parallelism.
  Tensor to_experts(const SublayerActs& a, const Tensor& rows) const;
  Tensor from_experts(const SublayerActs& a, const Tensor& rows) const;
  Tensor stat_copy(const Tensor& t) const;  // t itself, or converted to the statistics' dtype
  Tensor new_act(int64_t rows, int64_t cols) const;    // uninitialised activations
  Tensor zero_act(int64_t rows, int64_t cols) const;   // zeroed (gradient accumulators)
  Tensor new_stat(const Shape& shape) const;           // fp32 (fp64) statistics
  Tensor on_device(const Tensor& t) const;             // t, copied here if it lives elsewhere
  // Typed parameters (ModelParams, resolved once at construction).
  const LayerParams& layer(int64_t l) const;  // transformer layer l (of this part)
  Param& out_proj_of(int64_t s) const;  // sublayer s's last projection (o_proj, down_proj)
  // That projection's input in a's record (the attention's output, a KDA
  // layer's gated output norm, the SwiGLU's output).
  const Tensor& out_proj_input(int64_t s, const SublayerActs& a) const;
  // A KDA layer's dimensions (model.kda), an MLA layer's (model.mla).
  KdaDims kda_dims() const;
  MlaDims mla_dims() const;
  Param& norm_gain(int64_t s) const;    // the RMSNorm gain of sublayer s
  // The Mix parameter of sublayer s: its query w, an input query's W_l or
  // the scalar logits (model.residual).
  Param& mix_query(int64_t s) const;

  ModelConfig cfg_;
  DType dtype_;
  Device device_;
  ParamTable params_;
  ParamTable state_;
  ModelParams w_;  // typed handles into params_ and state_
  DepthStats* depth_stats_ = nullptr;  // not owned; see set_depth_stats
  MoeStats* moe_stats_ = nullptr;      // not owned; see set_moe_stats
  ExpertExchange* exchange_ = nullptr; // not owned; see set_expert_exchange
  Recompute recompute_ = Recompute::None;
  DType logits_ = DType::F32;
  kernels::AttentionKernel attention_kernel_ = kernels::AttentionKernel::Own;
};

}  // namespace attnres::model
