#include "train/config.h"

#include <algorithm>
#include <fstream>
#include <set>
#include <sstream>
#include <type_traits>

#include "core/device.h"
#include "core/error.h"
#include "train/multiple_choice.h"

namespace attnres::train {

namespace {

const char* json_type(const json& v) {
  if (v.is_boolean()) return "boolean";
  if (v.is_number_integer()) return "integer";
  if (v.is_number()) return "number";
  if (v.is_string()) return "string";
  if (v.is_array()) return "array";
  if (v.is_object()) return "object";
  return "null";
}

// ---------------------------------------------------------------------------
// Enum values and their names in the file
// ---------------------------------------------------------------------------

template <typename E>
struct EnumName {
  E value;
  const char* name;
};
template <typename E>
struct Names;  // Names<E>::all: every value of E with its name
template <>
struct Names<model::ResidualMode> {
  static inline const EnumName<model::ResidualMode> all[] = {
      {model::ResidualMode::Baseline, model::residual_mode_name(model::ResidualMode::Baseline)},
      {model::ResidualMode::Full, model::residual_mode_name(model::ResidualMode::Full)},
      {model::ResidualMode::Block, model::residual_mode_name(model::ResidualMode::Block)},
      {model::ResidualMode::DenseFormer, model::residual_mode_name(model::ResidualMode::DenseFormer)}};
};
template <>
struct Names<model::MixQuery> {
  static inline const EnumName<model::MixQuery> all[] = {
      {model::MixQuery::Static, model::mix_query_name(model::MixQuery::Static)},
      {model::MixQuery::Input, model::mix_query_name(model::MixQuery::Input)}};
};
template <>
struct Names<model::MixWeights> {
  static inline const EnumName<model::MixWeights> all[] = {
      {model::MixWeights::Attention, model::mix_weights_name(model::MixWeights::Attention)},
      {model::MixWeights::Scalars, model::mix_weights_name(model::MixWeights::Scalars)}};
};
template <>
struct Names<kernels::MixScore> {
  static inline const EnumName<kernels::MixScore> all[] = {
      {kernels::MixScore::Softmax, model::mix_score_name(kernels::MixScore::Softmax)},
      {kernels::MixScore::Sigmoid, model::mix_score_name(kernels::MixScore::Sigmoid)}};
};
template <>
struct Names<model::Recompute> {
  static inline const EnumName<model::Recompute> all[] = {
      {model::Recompute::None, model::recompute_name(model::Recompute::None)},
      {model::Recompute::Mix, model::recompute_name(model::Recompute::Mix)},
      {model::Recompute::Layer, model::recompute_name(model::Recompute::Layer)}};
};
template <>
struct Names<kernels::MoeRouter> {
  static constexpr EnumName<kernels::MoeRouter> all[] = {{kernels::MoeRouter::Sigmoid, "sigmoid"},
                                                         {kernels::MoeRouter::Softmax, "softmax"}};
};
template <>
struct Names<model::MoeBalance> {
  static inline const EnumName<model::MoeBalance> all[] = {
      {model::MoeBalance::AuxFree, model::moe_balance_name(model::MoeBalance::AuxFree)},
      {model::MoeBalance::AuxLoss, model::moe_balance_name(model::MoeBalance::AuxLoss)},
      {model::MoeBalance::None, model::moe_balance_name(model::MoeBalance::None)}};
};
template <>
struct Names<OptimizerType> {
  static constexpr EnumName<OptimizerType> all[] = {{OptimizerType::AdamW, "adamw"},
                                                    {OptimizerType::Muon, "muon"}};
};
template <>
struct Names<ScheduleType> {
  static constexpr EnumName<ScheduleType> all[] = {
      {ScheduleType::Constant, "constant"}, {ScheduleType::Cosine, "cosine"}, {ScheduleType::Wsd, "wsd"}};
};
template <>
struct Names<TransportKind> {
  static constexpr EnumName<TransportKind> all[] = {
      {TransportKind::Auto, "auto"}, {TransportKind::Mpi, "mpi"}, {TransportKind::Nccl, "nccl"}};
};
template <>
struct Names<Logits> {
  static constexpr EnumName<Logits> all[] = {
      {Logits::Auto, "auto"}, {Logits::F32, "fp32"}, {Logits::BF16, "bf16"}};
};
template <>
struct Names<kernels::AttentionKernel> {
  static constexpr EnumName<kernels::AttentionKernel> all[] = {
      {kernels::AttentionKernel::Auto, "auto"},
      {kernels::AttentionKernel::Own, "own"},
      {kernels::AttentionKernel::Cudnn, "cudnn"}};
};
template <>
struct Names<CudaGraphs> {  // JSON true and false are read as "true" and "false" (Reader)
  static constexpr EnumName<CudaGraphs> all[] = {
      {CudaGraphs::Auto, "auto"}, {CudaGraphs::On, "true"}, {CudaGraphs::Off, "false"}};
};
template <>
struct Names<Device> {
  static inline const EnumName<Device> all[] = {{Device::CPU, device_name(Device::CPU)},
                                                {Device::CUDA, device_name(Device::CUDA)}};
};
template <>
struct Names<DType> {  // training.precision: the compute dtypes a run may use
  static constexpr EnumName<DType> all[] = {{DType::F32, "fp32"}, {DType::BF16, "bf16"}};
};

template <typename E>
const char* name_of(E v) {
  for (const auto& e : Names<E>::all)
    if (e.value == v) return e.name;
  ATTNRES_CHECK(false, "enum value without a name");
  return "";
}
template <typename E>
std::string names_of() {
  std::string out;
  for (const auto& e : Names<E>::all) out += std::string(out.empty() ? "" : ", ") + e.name;
  return out;
}
// The value called `name`; an error naming `where` and the allowed names otherwise.
template <typename E>
E parse_name(const std::string& name, const std::string& where) {
  for (const auto& e : Names<E>::all)
    if (name == e.name) return e.value;
  fail(where, ": unknown value \"", name, "\" (expected ", names_of<E>(), ")");
}
template <typename E>
constexpr bool is_named_enum = std::is_same_v<E, model::ResidualMode> ||
                               std::is_same_v<E, model::MixQuery> ||
                               std::is_same_v<E, model::MixWeights> ||
                               std::is_same_v<E, kernels::MixScore> || std::is_same_v<E, model::Recompute> ||
                               std::is_same_v<E, ScheduleType> || std::is_same_v<E, OptimizerType> || std::is_same_v<E, TransportKind> ||
                               std::is_same_v<E, Logits> ||
                               std::is_same_v<E, kernels::AttentionKernel> ||
                               std::is_same_v<E, CudaGraphs> ||
                               std::is_same_v<E, kernels::MoeRouter> ||
                               std::is_same_v<E, model::MoeBalance> ||
                               std::is_same_v<E, Device> || std::is_same_v<E, DType>;

// ---------------------------------------------------------------------------
// The key table: every key once
// ---------------------------------------------------------------------------

// A key's own check, applied when it is read (cross-key checks are in validate()).
enum class Check { None, Positive, NonNegative, PositiveReal, NonNegativeReal, Fraction, OpenFraction };

struct KeySpec {
  const char* meaning;              // one line for docs/config.md
  Check check = Check::None;
  const char* shown_default = nullptr;  // the docs' default column, when not the member's value
  bool omit_unset = false;          // left out of the resolved config while 0 / empty
  // A residual variant's key: written into the resolved config only when
  // the model has a variant (so an AttnRes config is what it was before them).
  bool variant = false;
};

// Calls v(key, member, spec) for every key of the config, in docs order (C is
// Config or const Config). The member's initial value in Config is the key's default.
template <typename C, typename V>
void for_each_key(C& c, V&& v) {
  auto& m = c.model;
  v("model.vocab_size", m.vocab_size, KeySpec{"V; token ids must be < V", Check::Positive, "required"});
  v("model.d_model", m.d_model, KeySpec{"width d", Check::Positive, "required"});
  v("model.n_layers", m.n_layers, KeySpec{"transformer layers L (2L sublayers)", Check::Positive, "required"});
  v("model.n_heads", m.n_heads,
    KeySpec{"query heads H; GQA: must divide d, d/H even (RoPE)", Check::Positive, "required"});
  v("model.n_kv_heads", m.n_kv_heads,
    KeySpec{"key/value heads (GQA); must divide H", Check::Positive, "`n_heads`"});
  v("model.d_ff", m.d_ff, KeySpec{"SwiGLU hidden width", Check::Positive, "required"});
  v("model.norm_eps", m.norm_eps, KeySpec{"RMSNorm epsilon (also used by the AttnRes key norm)", Check::PositiveReal});
  v("model.rope_theta", m.rope_theta, KeySpec{"RoPE base", Check::PositiveReal});
  v("model.tie_embeddings", m.tie_embeddings, KeySpec{"LM head reuses the embedding matrix"});
  v("model.residual.mode", m.mode, KeySpec{"`baseline`, `full`, `block` or `denseformer`"});
  v("model.residual.block_size", m.block_size,
    KeySpec{"S, sublayers per block (block mode; exactly one of S / N)", Check::None, "—", true});
  v("model.residual.n_blocks", m.n_blocks,
    KeySpec{"N; then S = ceil(2L / N)", Check::None, "—", true});
  // The residual variants (docs/model.md "Residual variants").
  auto& rv = m.variant;
  v("model.residual.query", rv.query,
    KeySpec{"`static` (a learnt w_l) or `input`: q_l = W_l v, v the Mix's most recent source",
            Check::None, nullptr, false, true});
  v("model.residual.weights", rv.weights,
    KeySpec{"`attention` (query . key), or `scalars`: softmax_j of learnt s_l,j, no query or key",
            Check::None, nullptr, false, true});
  v("model.residual.score", rv.score,
    KeySpec{"`softmax` over the sources, or `sigmoid` of each logit (not normalised)",
            Check::None, nullptr, false, true});
  v("model.residual.key_norm", rv.key_norm,
    KeySpec{"keys RMSNorm(v_j) (true) or the raw sources v_j", Check::None, nullptr, false, true});
  v("model.residual.heads", rv.heads,
    KeySpec{"H dividing d: channel groups, each with its part of q, key norm and softmax",
            Check::Positive, nullptr, false, true});
  v("model.residual.window", rv.window,
    KeySpec{"full mode: W > 0 reads the embedding and the W most recent outputs (0: all)",
            Check::NonNegative, nullptr, false, true});
  v("model.init_from", m.init_from,
    KeySpec{"safetensors file or checkpoint directory to start from", Check::None, "—", true});
  // The MoE section (docs/model.md, "Mixture of experts"): written into the
  // resolved config only when the model has one (experts > 0), so a dense
  // model's config is what it was before the section existed.
  auto& moe = m.moe;
  v("model.moe.experts", moe.experts,
    KeySpec{"routed experts E; 0 (the section absent): every MLP is dense", Check::NonNegative});
  v("model.moe.top_k", moe.top_k,
    KeySpec{"experts per token K, in [1, E]", Check::None, "required with experts"});
  v("model.moe.shared_experts", moe.shared_experts,
    KeySpec{"always-on experts, together one SwiGLU of width shared_experts x expert_d_ff",
            Check::NonNegative});
  v("model.moe.expert_d_ff", moe.expert_d_ff,
    KeySpec{"each expert's SwiGLU width Fe", Check::None, "required with experts"});
  v("model.moe.router", moe.router,
    KeySpec{"`sigmoid` (s = sigmoid(r), DeepSeek-V3) or `softmax` (Mixtral)"});
  v("model.moe.routed_scale", moe.routed_scale,
    KeySpec{"the routed experts' weights s / sum(s) times this", Check::PositiveReal});
  v("model.moe.balance", moe.balance,
    KeySpec{"`aux_free` (a bias on the choice, nudged after each step), `aux_loss` or `none`"});
  v("model.moe.bias_rate", moe.bias_rate,
    KeySpec{"aux_free: b_e += rate sign(mean load - load_e) after each optimizer step",
            Check::NonNegativeReal});
  v("model.moe.aux_loss_coef", moe.aux_loss_coef,
    KeySpec{"aux_loss: coef E sum_e f_e P_e per microbatch and MoE layer", Check::NonNegativeReal});
  v("model.moe.dense_layers", moe.dense_layers,
    KeySpec{"the first layers keep the dense MLP (d_ff); in [0, n_layers)", Check::NonNegative});
  v("model.moe.capacity_factor", moe.capacity_factor,
    KeySpec{"0: dropless; c > 0: an expert takes ceil(c N K / E) of a microbatch's N tokens, "
            "later slots dropped", Check::NonNegativeReal});
  // The hybrid section (docs/model.md, "KDA layer"), like MoE's: written
  // only when the model has one (heads > 0).
  auto& kda = m.kda;
  v("model.kda.heads", kda.heads,
    KeySpec{"KDA heads H; 0 (the section absent): every layer keeps softmax attention",
            Check::NonNegative});
  v("model.kda.head_dim", kda.head_dim,
    KeySpec{"K = V, the key and value width per KDA head", Check::None, "required with heads"});
  v("model.kda.conv_size", kda.conv_size,
    KeySpec{"the short causal convolutions' width", Check::Positive});
  v("model.kda.full_attention_every", kda.full_attention_every,
    KeySpec{"softmax attention in the 1-based layers l with l % every == 0, and the last",
            Check::NonNegative, "4 (when neither is given)", true});
  v("model.kda.full_attention_layers", kda.full_attention_layers,
    KeySpec{"or the softmax layers listed (1-based, as Kimi's `full_attn_layers`); not with "
            "full_attention_every", Check::None, "—", true});
  // The softmax layers as MLA (docs/model.md, "MLA layer"): written only
  // when the model has them (kv_lora_rank > 0).
  auto& mla = m.mla;
  v("model.mla.kv_lora_rank", mla.kv_lora_rank,
    KeySpec{"r, the latent width of c_kv; 0 (the section absent): the softmax layers are GQA",
            Check::NonNegative});
  v("model.mla.qk_nope_head_dim", mla.qk_nope_head_dim,
    KeySpec{"dn, a head's query and key dims without position", Check::NonNegative});
  v("model.mla.qk_rope_head_dim", mla.qk_rope_head_dim,
    KeySpec{"dr, the query dims that meet k_r, the key part shared by all heads",
            Check::NonNegative});
  v("model.mla.v_head_dim", mla.v_head_dim,
    KeySpec{"dv, a head's value width", Check::None, "required with kv_lora_rank"});
  v("model.mla.rope", mla.rope,
    KeySpec{"false: no position signal (Kimi Linear's NoPE); true: RoPE on the dr dims"});
  auto& o = c.optimizer;
  v("optimizer.type", o.type,
    KeySpec{"`adamw`, or `muon`: Muon for the 2-D weights inside the layers, AdamW for the rest"});
  v("optimizer.lr", o.lr, KeySpec{"peak learning rate", Check::PositiveReal});
  v("optimizer.beta1", o.beta1, KeySpec{"AdamW beta1", Check::OpenFraction});
  v("optimizer.beta2", o.beta2, KeySpec{"AdamW beta2", Check::OpenFraction});
  v("optimizer.eps", o.eps, KeySpec{"AdamW epsilon", Check::PositiveReal});
  v("optimizer.weight_decay", o.weight_decay,
    KeySpec{"decoupled decay, tensors with >= 2 dims only", Check::NonNegativeReal});
  v("optimizer.grad_clip", o.grad_clip, KeySpec{"global-norm clip; 0 disables", Check::NonNegativeReal});
  v("optimizer.momentum", o.momentum, KeySpec{"Muon's Nesterov momentum", Check::OpenFraction});
  auto& sc = c.schedule;
  v("schedule.type", sc.type, KeySpec{"`constant`, `cosine` or `wsd`"});
  v("schedule.warmup_steps", sc.warmup_steps, KeySpec{"linear warmup: lr (k+1)/W", Check::NonNegative});
  v("schedule.min_lr_ratio", sc.min_lr_ratio, KeySpec{"floor lr_min = lr * ratio", Check::Fraction});
  v("schedule.decay_ratio", sc.decay_ratio,
    KeySpec{"wsd: fraction of steps in the final linear decay", Check::Fraction});
  auto& t = c.training;
  v("training.steps", t.steps, KeySpec{"optimizer steps K", Check::Positive, "required"});
  v("training.micro_batch_size", t.micro_batch_size,
    KeySpec{"B sequences per microbatch", Check::Positive, "required"});
  v("training.seq_len", t.seq_len, KeySpec{"T tokens per sequence", Check::Positive, "required"});
  v("training.grad_accum", t.grad_accum,
    KeySpec{"A microbatches per step (also the pipeline's microbatch count)", Check::Positive});
  v("training.seed", t.seed, KeySpec{"initialisation and data shuffling"});
  v("training.device", t.device,
    KeySpec{"`cpu` or `cuda` (one GPU per process; see [cuda.md](cuda.md))"});
  v("training.precision", t.precision,
    KeySpec{"`fp32`, or `bf16` on `cuda` (bf16 weights/activations, fp32 master weights, "
            "optimizer state and reductions)"});
  v("training.logits", t.logits,
    KeySpec{"the LM head's logits: `auto` (bf16 in a `bf16` run, fp32 in an `fp32` run), `fp32` "
            "(the exact reference) or `bf16` (needs `precision` = `bf16`); the loss and softmax are "
            "computed in fp32 either way, and scoring (`attnres score`, `eval.tasks`) always uses "
            "fp32 logits ([cuda.md](cuda.md))"});
  v("training.attention_kernel", t.attention_kernel,
    KeySpec{"attention on `cuda`: `own` (ours), `auto` (cuDNN's fused attention where it runs "
            "the shape and dtype on the GPU, else ours; the log says which) or `cudnn` (an error "
            "where cuDNN cannot run; needs `device` = `cuda`); the CPU runs its own. `own` is the "
            "default until cuDNN's path has run on a GPU ([cuda.md](cuda.md))"});
  v("training.recompute", t.recompute,
    KeySpec{"what the backward recomputes instead of keeping: `none`, `mix` (the Mix, norms and "
            "SwiGLU; GEMM and attention outputs kept) or `layer` (everything but each sublayer's "
            "input); the same bits in every mode ([memory.md](memory.md))"});
  v("training.cuda_graphs", t.cuda_graphs,
    KeySpec{"each rank's training step as one CUDA graph, captured at the second step and "
            "replayed (the same bits): `true` (on `cuda`; with pipeline or data-parallel peers "
            "over the NCCL transport, communication captured too; depth-statistics steps run "
            "without), `false`, or `auto` (off until graphs have run on a GPU) "
            "([cuda.md](cuda.md))"});
  v("training.peak_tflops", t.peak_tflops,
    KeySpec{"peak FLOP/s of one device for the MFU figure; 0 = from the GPU's name (H100 SXM, "
            "H200: 989 bf16, 67 fp32; H100 PCIe: 756, 51; A100: 312, 19.5; another GPU: no MFU)",
            Check::NonNegativeReal});
  auto& d = c.data;
  v("data.train", d.train, KeySpec{"shard file, directory or glob (sorted)", Check::None, "required"});
  v("data.val", d.val, KeySpec{"validation shards (the val loss at every evaluation); `eval.every` > 0 needs them "
                              "or `eval.tasks`", Check::None, "—"});
  v("data.tokenizer", d.tokenizer,
    KeySpec{"tokenizer: ours (`tokenize train`), GPT-2's `encoder.json` + `vocab.bpe` (either file, "
            "or their directory) or a Hugging Face byte-level BPE `tokenizer.json`; read at start-up "
            "(its vocabulary must fit `model.vocab_size`) and written into every checkpoint as one "
            "`tokenizer.json` for `generate`", Check::None, "—"});
  v("data.shuffle", d.shuffle, KeySpec{"seeded permutation of units per epoch"});
  auto& p = c.parallel;
  v("parallel.pipeline", p.pipeline,
    KeySpec{"P pipeline stages; run with `mpirun -np P*D` ([parallel.md](parallel.md))", Check::Positive});
  v("parallel.virtual_stages", p.virtual_stages,
    KeySpec{"V chunks per stage (interleaved 1F1B); needs P > 1", Check::Positive});
  v("parallel.layers_per_chunk", p.layers_per_chunk,
    KeySpec{"layers of each of the P*V chunks in order (chunk c runs on stage c mod P), summing to "
            "`model.n_layers`; `inspect plan` prints one balanced by cost", Check::None,
            "even split", true});
  v("parallel.data", p.data, KeySpec{"D data-parallel replicas", Check::Positive});
  v("parallel.expert", p.expert,
    KeySpec{"EP: expert parallelism of a MoE model; each group of EP replicas holds E / EP routed "
            "experts per rank and exchanges token rows by all-to-all (divides `parallel.data` and "
            "`model.moe.experts`)", Check::Positive});
  v("parallel.cache_blocks", p.cache_blocks,
    KeySpec{"cross-stage block caching (false: the naive protocol, same numbers, more traffic)"});
  v("parallel.zero", p.zero,
    KeySpec{"`1`: ZeRO-1, AdamW state and fp32 master weights split over the D replicas "
            "(gradients reduce-scattered, weights all-gathered); `0`: replicated "
            "([memory.md](memory.md))", Check::NonNegative});
  v("parallel.transport", p.transport,
    KeySpec{"`mpi` (host memory), `nccl` (device memory, `training.device = \"cuda\"`), or `auto` "
            "(nccl on cuda when built with NCCL, else mpi)"});
  auto& ck = c.checkpoint;
  v("checkpoint.dir", ck.dir, KeySpec{"where `step_XXXXXXXX/` go; empty = no checkpoints", Check::None, "—"});
  v("checkpoint.every", ck.every, KeySpec{"steps between checkpoints (0 = only the final one)", Check::NonNegative});
  v("checkpoint.keep_last", ck.keep_last, KeySpec{"keep only the newest N (0 = all)", Check::NonNegative});
  v("checkpoint.resume", ck.resume,
    KeySpec{"`never`, `auto` (newest undamaged checkpoint, else fresh) or a checkpoint directory"});
  v("checkpoint.sharded", ck.sharded,
    KeySpec{"each pipeline stage writes its own safetensors shard + a Hugging Face index (no tensor "
            "crosses ranks); false: rank 0 gathers everything into one file ([files.md](files.md))"});
  v("checkpoint.async", ck.async,
    KeySpec{"write checkpoints in background threads while training goes on (the step copies what "
            "it saves to host memory first; at most one save in flight; SIGTERM and the end wait "
            "for it); false: training waits for every save ([files.md](files.md))"});
  v("checkpoint.save_initial", ck.save_initial,
    KeySpec{"also write `step_00000000` before the first update"});
  auto& e = c.eval;
  v("eval.every", e.every,
    KeySpec{"evaluate every N steps and at the end (0 = only at the end, if `data.val` or `eval.tasks` "
            "is set)",
            Check::NonNegative});
  v("eval.batches", e.batches,
    KeySpec{"validation units (B x T tokens each) per evaluation, always the first N", Check::Positive});
  v("eval.tasks", e.tasks,
    KeySpec{"multiple-choice tasks scored at every evaluation, `hellaswag:FILE` entries separated "
            "by commas (needs `data.tokenizer`; [ecosystem.md](ecosystem.md))", Check::None, "—", true});
  v("eval.task_examples", e.task_examples,
    KeySpec{"score only the first N questions of each task (0 = all)", Check::NonNegative});
  v("eval.scoring", e.scoring,
    KeySpec{"how tasks are rendered and `acc_norm` normalised: `lm-eval` (lm-evaluation-harness's "
            "hellaswag, per character) or `llm.c` (per token) ([ecosystem.md](ecosystem.md))"});
  auto& r = c.run;
  v("run.dir", r.dir, KeySpec{"where `metrics.jsonl` goes"});
  v("run.log_every", r.log_every, KeySpec{"progress line every N steps", Check::Positive});
  v("run.stop_after", r.stop_after,
    KeySpec{"stop (with a checkpoint) after this many steps in this invocation", Check::NonNegative});
  v("run.depth_stats_every", r.depth_stats_every,
    KeySpec{"every N steps (and at the last step) write per-sublayer output RMS and gradient "
            "norms to `<run.dir>/depth_stats.jsonl` ([files.md](files.md), [sweeps.md](sweeps.md)); "
            "0 = off, at no cost", Check::NonNegative});
}

// "a.b.c" -> {"a", "b", "c"}
std::vector<std::string> split_key(const std::string& key) {
  std::vector<std::string> parts;
  std::stringstream ss(key);
  std::string part;
  while (std::getline(ss, part, '.')) parts.push_back(part);
  return parts;
}

template <typename T>
void check_value(const std::string& key, const T& v, Check check) {
  if constexpr (std::is_same_v<T, int64_t>) {
    if (check == Check::Positive && v <= 0) fail("config key ", key, ": must be a positive integer, got ", v);
    if (check == Check::NonNegative && v < 0) fail("config key ", key, ": must be >= 0, got ", v);
  } else if constexpr (std::is_same_v<T, double>) {
    if (check == Check::PositiveReal && !(v > 0)) fail("config key ", key, ": must be > 0, got ", v);
    if (check == Check::NonNegativeReal && !(v >= 0)) fail("config key ", key, ": must be >= 0, got ", v);
    if (check == Check::Fraction && !(v >= 0 && v <= 1))
      fail("config key ", key, ": must be in [0, 1], got ", v);
    if (check == Check::OpenFraction && !(v >= 0 && v < 1))
      fail("config key ", key, ": must be in [0, 1), got ", v);
  }
}

// Reads one key's JSON value into its member, checking type, allowed values and range.
struct Reader {
  const json& root;
  const std::string& source;
  std::set<std::string> present;

  template <typename T>
  void operator()(const char* key, T& out, const KeySpec&) {
    const json* v = &root;
    for (const auto& part : split_key(key)) {
      if (!v->is_object()) return;  // a section that is not an object: reported by check_keys
      auto it = v->find(part);
      if (it == v->end()) return;
      v = &*it;
    }
    present.insert(key);
    auto wrong = [&](const std::string& expected) {
      fail(source, ": config key '", key, "' must be ", expected, ", got ", json_type(*v), " ",
           v->dump());
    };
    if constexpr (std::is_same_v<T, int64_t>) {
      if (!v->is_number_integer()) wrong("an integer");
      out = v->get<int64_t>();
    } else if constexpr (std::is_same_v<T, uint64_t>) {
      if (!v->is_number_integer() || v->get<int64_t>() < 0) wrong("a non-negative integer");
      out = v->get<uint64_t>();
    } else if constexpr (std::is_same_v<T, double>) {
      if (!v->is_number()) wrong("a number");
      out = v->get<double>();
    } else if constexpr (std::is_same_v<T, bool>) {
      if (!v->is_boolean()) wrong("true or false");
      out = v->get<bool>();
    } else if constexpr (std::is_same_v<T, std::string>) {
      if (!v->is_string()) wrong("a string");
      out = v->get<std::string>();
    } else if constexpr (std::is_same_v<T, std::vector<int64_t>>) {
      if (!v->is_array()) wrong("a list of integers");
      out.clear();
      for (const json& x : *v) {
        if (!x.is_number_integer()) wrong("a list of integers");
        out.push_back(x.get<int64_t>());
      }
    } else {
      static_assert(is_named_enum<T>, "a config key of an unsupported type");
      if constexpr (std::is_same_v<T, CudaGraphs>)
        if (v->is_boolean()) {
          out = v->get<bool>() ? CudaGraphs::On : CudaGraphs::Off;
          return;
        }
      if (!v->is_string()) wrong("one of " + names_of<T>());
      out = parse_name<T>(v->get<std::string>(), source + ": config key '" + key + "'");
    }
  }
};

// Every key present in j must be a declared key (or a section holding some).
void check_keys(const json& j, const std::string& prefix, const std::set<std::string>& keys,
                const std::string& source) {
  if (!j.is_object() && prefix.empty()) fail(source, ": a config must be a JSON object, got ", json_type(j));
  if (!j.is_object())
    fail(source, ": config key '", prefix, "' must be an object, got ", json_type(j));
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string key = prefix.empty() ? it.key() : prefix + "." + it.key();
    if (keys.count(key)) continue;
    const bool section = std::any_of(keys.begin(), keys.end(),
                                     [&](const std::string& k) { return k.rfind(key + ".", 0) == 0; });
    if (!section) fail(source, ": unknown config key '", key, "'");
    check_keys(it.value(), key, keys, source);
  }
}

// Writes one key of the resolved config (the MoE section only when there is one).
struct Writer {
  json& out;
  bool moe, kda, mla, variant;
  template <typename T>
  void operator()(const char* key, const T& v, const KeySpec& spec) {
    if (!variant && spec.variant) return;
    if (!moe && std::string(key).rfind("model.moe.", 0) == 0) return;
    if (!kda && std::string(key).rfind("model.kda.", 0) == 0) return;
    if (!mla && std::string(key).rfind("model.mla.", 0) == 0) return;
    json value;
    if constexpr (std::is_same_v<T, CudaGraphs>) {
      value = v == CudaGraphs::Auto ? json("auto") : json(v == CudaGraphs::On);
    } else if constexpr (is_named_enum<T>) {
      value = name_of(v);
    } else {
      if (spec.omit_unset && v == T{}) return;
      value = v;
    }
    json* node = &out;
    const auto parts = split_key(key);
    for (size_t i = 0; i + 1 < parts.size(); ++i) node = &(*node)[parts[i]];
    (*node)[parts.back()] = value;
  }
};

std::string check_text(Check c) {
  switch (c) {
    case Check::Positive:
    case Check::PositiveReal: return "> 0";
    case Check::NonNegative:
    case Check::NonNegativeReal: return ">= 0";
    case Check::Fraction: return "in [0, 1]";
    case Check::OpenFraction: return "in [0, 1)";
    case Check::None: return "";
  }
  return "";
}

// The JSON type a key takes, for the docs.
template <typename T>
std::string type_text() {
  if constexpr (std::is_same_v<T, CudaGraphs>) return "bool or string";
  else if constexpr (is_named_enum<T>) return "string";
  else if constexpr (std::is_same_v<T, bool>) return "bool";
  else if constexpr (std::is_same_v<T, std::string>) return "string";
  else if constexpr (std::is_same_v<T, double>) return "number";
  else if constexpr (std::is_same_v<T, std::vector<int64_t>>) return "list of integers";
  else return "integer";
}

}  // namespace

const char* transport_name(TransportKind t) { return name_of(t); }
const char* precision_name(DType t) { return name_of(t); }
Device parse_device(const std::string& name, const std::string& where) {
  return parse_name<Device>(name, where);
}
DType parse_precision(const std::string& name, const std::string& where) {
  return parse_name<DType>(name, where);
}
model::Recompute parse_recompute(const std::string& name, const std::string& where) {
  return parse_name<model::Recompute>(name, where);
}
Logits parse_logits(const std::string& name, const std::string& where) {
  return parse_name<Logits>(name, where);
}
kernels::AttentionKernel parse_attention_kernel(const std::string& name, const std::string& where) {
  return parse_name<kernels::AttentionKernel>(name, where);
}
DType logit_dtype(Logits logits, DType compute) {
  return logits == Logits::F32 ? DType::F32 : compute;
}

Config Config::from_json(const json& j, const std::string& source) {
  Config c;
  std::set<std::string> keys;
  for_each_key(c, [&](const char* key, auto&, const KeySpec&) { keys.insert(key); });
  check_keys(j, "", keys, source);
  Reader reader{j, source, {}};
  for_each_key(c, reader);
  // GQA off unless asked for: n_kv_heads defaults to n_heads.
  if (!reader.present.count("model.n_kv_heads")) c.model.n_kv_heads = c.model.n_heads;
  return c;
}

json Config::to_json() const {
  json out;
  for_each_key(*this, Writer{out, model.has_moe(), model.has_kda(), model.has_mla(),
                            !model.variant.is_default()});
  return out;
}

std::string config_reference_table() {
  std::ostringstream os;
  os << "| key | type | default | check | meaning |\n|---|---|---|---|---|\n";
  const Config defaults;
  for_each_key(defaults, [&](const char* key, const auto& v, const KeySpec& spec) {
    using T = std::decay_t<decltype(v)>;
    std::string def;
    if (spec.shown_default) {
      def = spec.shown_default;
    } else if constexpr (is_named_enum<T>) {
      def = std::string("`") + name_of(v) + "`";
    } else if constexpr (std::is_same_v<T, bool>) {
      def = v ? "true" : "false";
    } else if constexpr (std::is_same_v<T, std::string>) {
      def = "`" + v + "`";
    } else {
      def = json(v).dump();
    }
    os << "| `" << key << "` | " << type_text<T>() << " | " << def << " | " << check_text(spec.check)
       << " | " << spec.meaning << " |\n";
  });
  return os.str();
}

void Config::validate() const {
  model.validate();
  // Each key's own range (the key table), then what involves several keys.
  for_each_key(*this, [](const char* key, const auto& v, const KeySpec& spec) {
    check_value(key, v, spec.check);
  });
  // Before the build's check: these hold in any build (and are tested in all).
  if (training.cuda_graphs == CudaGraphs::On) {
    if (training.device != Device::CUDA)
      fail("config key training.cuda_graphs: true needs training.device = \"cuda\" (the CPU runs "
           "its step as it is; use false or \"auto\")");
    if (parallel.pipeline * parallel.data > 1 && parallel.transport == TransportKind::Mpi)
      fail("config key training.cuda_graphs: true with ", parallel.pipeline * parallel.data,
           " ranks (pipeline = ", parallel.pipeline, ", data = ", parallel.data,
           ") captures their communication too, which parallel.transport = \"mpi\" cannot (the "
           "host drives its transfers): use \"nccl\" or \"auto\", or cuda_graphs = false");
    if (model.has_moe())
      fail("config key training.cuda_graphs: true with model.moe: a MoE layer's expert GEMMs are "
           "sized by the routing, which the host reads back each microbatch (and a dropless "
           "layer's sizes change from step to step), so its step cannot be one captured graph; "
           "use false or \"auto\"");
  }
  if (training.device == Device::CUDA && !cuda::compiled())
    fail("config key training.device: \"cuda\", but this build has no CUDA backend (nvcc was not "
         "found when it was configured); use \"cpu\" or rebuild with the CUDA toolkit");
  if (training.precision == DType::BF16 && training.device == Device::CPU)
    fail("config key training.precision: bf16 is a CUDA precision; the CPU trains in fp32");
  if (training.logits == Logits::BF16 && training.precision != DType::BF16)
    fail("config key training.logits: \"bf16\" needs training.precision = \"bf16\" (on cuda); an "
         "fp32 run keeps fp32 logits (use \"auto\" or \"fp32\")");
  if (training.attention_kernel == kernels::AttentionKernel::Cudnn && training.device != Device::CUDA)
    fail("config key training.attention_kernel: \"cudnn\" needs training.device = \"cuda\" (the "
         "CPU runs its own attention; use \"auto\" or \"own\")");
  if (data.train.empty()) fail("config key data.train: missing (a shard file, directory or glob)");
  if (parallel.pipeline * parallel.virtual_stages > model.n_layers)
    fail("config key parallel.pipeline: pipeline * virtual_stages = ",
         parallel.pipeline * parallel.virtual_stages, " chunks exceed model.n_layers = ",
         model.n_layers);
  if (parallel.virtual_stages > 1 && parallel.pipeline == 1)
    fail("config key parallel.virtual_stages: ", parallel.virtual_stages,
         " virtual stages need parallel.pipeline > 1 (they interleave chunks across pipeline ranks)");
  if (!parallel.layers_per_chunk.empty()) {
    const auto& split = parallel.layers_per_chunk;
    const int64_t C = parallel.pipeline * parallel.virtual_stages;
    if (static_cast<int64_t>(split.size()) != C)
      fail("config key parallel.layers_per_chunk: ", split.size(), " chunk sizes, but pipeline * "
           "virtual_stages = ", C, " chunks");
    int64_t sum = 0;
    for (int64_t n : split) {
      if (n < 1)
        fail("config key parallel.layers_per_chunk: every chunk needs at least one layer, got ", n);
      sum += n;
    }
    if (sum != model.n_layers)
      fail("config key parallel.layers_per_chunk: the chunk sizes sum to ", sum,
           ", model.n_layers is ", model.n_layers);
  }
  if (parallel.expert > 1) {
    if (!model.has_moe())
      fail("config key parallel.expert: ", parallel.expert,
           " needs a MoE model (model.moe); a dense model has no experts to split");
    if (parallel.data % parallel.expert != 0)
      fail("config key parallel.expert: ", parallel.expert, " does not divide parallel.data = ",
           parallel.data, " (each group of EP data-parallel replicas splits the experts)");
    if (model.moe.experts % parallel.expert != 0)
      fail("config key parallel.expert: ", parallel.expert, " does not divide model.moe.experts = ",
           model.moe.experts, " (each rank of a group holds experts / EP of them)");
  }
  if (parallel.zero > 1)
    fail("config key parallel.zero: 0 (replicated optimizer state) or 1 (ZeRO-1), got ",
         parallel.zero);
  if (parallel.transport == TransportKind::Nccl && training.device != Device::CUDA)
    fail("config key parallel.transport: \"nccl\" moves device memory and needs "
         "training.device = \"cuda\" (use \"mpi\" or \"auto\" on the cpu)");
  if (parallel.virtual_stages > 1 && training.grad_accum % parallel.pipeline != 0)
    fail("config key training.grad_accum: the interleaved schedule (virtual_stages > 1) needs "
         "grad_accum (microbatches) divisible by parallel.pipeline = ", parallel.pipeline,
         ", got ", training.grad_accum);
  if (checkpoint.resume.empty())
    fail("config key checkpoint.resume: must be \"never\", \"auto\" or a checkpoint directory");
  if (checkpoint.resume == "auto" && checkpoint.dir.empty())
    fail("config key checkpoint.resume: \"auto\" needs checkpoint.dir");
  if (eval.every > 0 && data.val.empty() && eval.tasks.empty())
    fail("config key data.val: missing, but eval.every = ", eval.every,
         " asks for evaluation (of data.val, or of eval.tasks)");
  parse_scoring(eval.scoring, "config key eval.scoring");
  if (!eval.tasks.empty()) {
    parse_task_list(eval.tasks, "eval.tasks");
    if (data.tokenizer.empty())
      fail("config key data.tokenizer: missing, but eval.tasks needs it to tokenize the tasks");
  }
  if (run.dir.empty()) fail("config key run.dir: must not be empty");
}

bool Config::cuda_graphs() const {
  // Auto stays off until a GPU session has proven graphs (docs/cuda.md's plan).
  return training.cuda_graphs == CudaGraphs::On;
}

void apply_override(json& j, const std::string& arg) {
  std::string a = arg;
  if (a.rfind("--", 0) != 0) fail("override '", arg, "': expected --section.key=value");
  a = a.substr(2);
  auto eq = a.find('=');
  if (eq == std::string::npos || eq == 0)
    fail("override '", arg, "': expected --section.key=value");
  std::string path = a.substr(0, eq), text = a.substr(eq + 1);
  json value;
  try {
    value = json::parse(text);
  } catch (const json::parse_error&) {
    value = text;  // a bare string such as --data.train=foo/*.bin
  }
  json* node = &j;
  std::stringstream ss(path);
  std::string part, walked;
  std::vector<std::string> parts;
  while (std::getline(ss, part, '.')) parts.push_back(part);
  for (size_t i = 0; i < parts.size(); ++i) {
    if (parts[i].empty()) fail("override '", arg, "': empty key component");
    walked += (i ? "." : "") + parts[i];
    if (i + 1 == parts.size()) {
      (*node)[parts[i]] = value;
    } else {
      json& next = (*node)[parts[i]];
      if (next.is_null()) next = json::object();
      if (!next.is_object()) fail("override '", arg, "': config key '", walked, "' is not a section");
      node = &next;
    }
  }
}

Config load_config(const std::string& path, const std::vector<std::string>& overrides) {
  std::ifstream f(path);
  if (!f) fail(path, ": cannot open config file");
  json j;
  try {
    j = json::parse(f, nullptr, true, /*ignore_comments=*/true);
  } catch (const json::parse_error& e) {
    fail(path, ": not valid JSON: ", e.what());
  }
  // A sweep file (configs/sweeps/, docs/sweeps.md) handed to train or
  // inspect: say what it is and how to get one of its runs' configs, rather
  // than "unknown config key 'base'".
  if (j.is_object() && j.contains("base") && (j.contains("sizes") || j.contains("modes")))
    fail(path, ": this is a sweep file (its keys 'base', 'sizes', 'modes'), not one run's config. "
         "Run it with `attnres sweep ", path, "`; `attnres sweep ", path,
         " --dry-run` lists its runs, and `attnres sweep ", path,
         " --print-config RUN > run.json` writes one run's config, for train, inspect memory "
         "or inspect plan");
  for (const auto& o : overrides) apply_override(j, o);
  Config c = Config::from_json(j, path);
  c.validate();
  return c;
}

}  // namespace attnres::train
