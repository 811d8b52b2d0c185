// The parameter table: every tensor of the model with its docs/model.md
// section 3 name: the trainable ones with their gradient buffer and whether
// AdamW decays them, and the model state that is no parameter (a MoE router's
// balancing bias: fp32, updated by the trainer, never by gradients).
#pragma once
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/tensor.h"
#include "model/config.h"

namespace attnres::model {

// Initialisations besides N(0, init_std) and constants (docs/model.md
// section 3), each element a pure function of (seed, the name, its index):
// KDA's A_log = log U(1, 16) and dt_bias = the inverse softplus of a dt
// log-uniform in [1e-3, 1e-1] (at least 1e-4), as FLA's KDA layer.
// LastOne: 1 at the last element, 0 elsewhere (DenseFormer's weights: a_{i,i} = 1).
enum class ParamInit : uint8_t { Default, LogUniform1to16, InverseSoftplusDt, LastOne };

// Mixed precision (docs/model.md section 4): a bf16 run computes with bf16 `value`
// and keeps the fp32 `master` copy that the optimizer updates and checkpoints
// store. Otherwise `master` is undefined and `value` is the only copy.
struct Param {
  std::string name;
  Tensor value;        // the weights the model computes with
  Tensor master;       // fp32 master weights when value is BF16; else undefined
  Tensor grad;         // F32 when value is BF16 (kernels::grad_dtype), else value's dtype
  bool decay;          // weight decay applies to tensors with >= 2 dims only
  double init_std;     // N(0, init_std); 0 = constant init_value
  double init_value;   // used when init_std == 0 (norm gains 1, AttnRes queries 0)
  // false: model state, not a parameter (no gradient: `grad` is undefined,
  // no optimizer state, not counted); saved, loaded and laid out as the rest.
  bool trainable = true;
  ParamInit init = ParamInit::Default;  // else init_std / init_value as above
  // A routed expert's (its global index), else -1: with expert parallelism
  // held by one member of each expert group, its gradient summed over the
  // replicas holding it (parallel::Replicas::SameExperts).
  int64_t expert = -1;

  // The full-precision weights: what the optimizer updates and checkpoints hold.
  Tensor& weights() { return master.defined() ? master : value; }
  const Tensor& weights() const { return master.defined() ? master : value; }
  // After weights() changed (load, init): value = master rounded to bf16.
  void sync_value();
};

class ParamTable {
 public:
  Param& add(const std::string& name, const Shape& shape, DType dtype, Device device,
             double init_std, double init_value = 0.0, bool trainable = true);
  // Moves parameters of the same dtype and row shape into one allocation
  // each for value, master and grad, their rows in the order named, keeping
  // their contents; Tensor::joined_rows then views them as one matrix (the
  // attention's q, k and v projections, the MLP's gate and up projections:
  // one GEMM each, model/attention.cpp and model/mlp.cpp).
  void join_rows(const std::vector<std::string>& names);
  Param& get(const std::string& name);
  const Param& get(const std::string& name) const;
  bool contains(const std::string& name) const { return index_.count(name) != 0; }
  std::vector<Param>& all() { return params_; }
  const std::vector<Param>& all() const { return params_; }
  int64_t numel() const;
  void zero_grads();
  // Deterministic initialisation (docs/model.md section 3): element i of tensor
  // `name` is init_std * normal(seed, fnv1a(name), i), so the values do not
  // depend on device, thread count or which rank holds the tensor.
  void init(uint64_t seed);

 private:
  std::vector<Param> params_;
  std::unordered_map<std::string, size_t> index_;
};

// Which parts of the model a ParamTable holds: the pipeline gives each rank
// only its chunks' layers (plus the embedding / head where they live).
struct ModelParts {
  int64_t layer_begin = 0, layer_end = -1;  // [begin, end); end -1 = all layers
  bool embedding = true;
  bool head = true;
  // The routed experts held (expert parallelism: E / EP of them per rank):
  // [begin, end); end -1 = all. Their names keep the global index.
  int64_t expert_begin = 0, expert_end = -1;
};

// What a parameter is for: its place in docs/model.md section 3.
enum class Slot : uint8_t {
  Embedding,                                   // model.embed_tokens.weight
  AttnNorm, Q, K, V, O,                        // model.layers.{l}.input_layernorm / self_attn.*
  MlpNorm, Gate, Up, Down,                     // post_attention_layernorm / mlp.*
  AttnQuery, MlpQuery,                         // AttnRes: attn_res.query, mlp_res.query
  // A KDA layer's self_attn.* (model.kda; docs/model.md "KDA layer"): q_proj,
  // k_proj, v_proj, their q/k/v_conv1d, A_log, dt_bias, f_a_proj, f_b_proj,
  // b_proj, g_a_proj, g_b_proj, o_norm, o_proj
  KdaQ, KdaK, KdaV, KdaQConv, KdaKConv, KdaVConv, KdaALog, KdaDtBias, KdaFA, KdaFB, KdaB,
  KdaGA, KdaGB, KdaONorm, KdaO,
  // An MLA layer's self_attn.* (model.mla; docs/model.md "MLA layer"):
  // q_proj, kv_a_proj_with_mqa, kv_a_layernorm, kv_b_proj, o_proj
  MlaQ, MlaKvA, MlaKvNorm, MlaKvB, MlaO,
  FinalQuery, FinalNorm, LmHead,               // model.final_res.query, model.norm, lm_head
  // A MoE layer's MLP: mlp.gate.weight (the router), mlp.gate.e_score_correction_bias
  // (aux_free balancing; model state), mlp.shared_experts.{gate,up,down}_proj,
  // mlp.experts.{e}.{gate,up,down}_proj
  Router, RouterBias, SharedGate, SharedUp, SharedDown, ExpertGate, ExpertUp, ExpertDown,
};

// One parameter's declaration. param_shapes is the one place where names,
// shapes and initialisations are written; the table, the counts, the FLOPs
// and the sweep all read them from here.
struct ParamShape {
  std::string name;   // the checkpoint / Hugging Face name
  Shape shape;
  double init_std;    // N(0, init_std); 0 = constant init_value
  double init_value;
  Slot slot;
  int64_t layer;      // transformer layer of a per-layer slot, else -1
  int64_t expert = -1;     // routed expert of an Expert* slot (its global index)
  bool trainable = true;   // false: model state (RouterBias)
  // Stored in the statistics' precision (fp32 in a bf16 run: a value, no
  // master): the routers, whose GEMM runs in fp32 (docs/model.md section 4).
  // The forward then reads `value` at the precision it computes in, whatever
  // ZeRO-1 does with the other parameters' masters.
  bool full_precision = false;
  ParamInit init = ParamInit::Default;
  bool no_decay = false;  // never decayed whatever its dims (KDA's A_log and dt_bias)
  int64_t numel() const;
};

// The parameters of `cfg` restricted to `parts`, in the table's fixed order.
std::vector<ParamShape> param_shapes(const ModelConfig& cfg, const ModelParts& parts = {});

// Parameter counts of the whole model: all of them (a tied embedding once),
// and all but the embedding and the LM head (the scaling-law N). A MoE
// model's activated ones count, per token, the router, the shared experts
// and top_k routed experts of each MoE layer instead of all E (the paper's
// N); model state (the routers' biases) is no parameter.
int64_t total_params(const ModelConfig& cfg);
int64_t non_embedding_params(const ModelConfig& cfg);
int64_t activated_non_embedding_params(const ModelConfig& cfg);

// Build the table for `cfg` restricted to `parts`, in param_shapes' order:
// the trainable parameters (make_params) and the model state (make_state:
// the MoE routers' biases, in the statistics' precision, no gradients; the
// optimizer, the gradient sums and ZeRO-1 see only the former).
// dtype: F32 or F64 (CPU), F32 or BF16 (CUDA; BF16 adds fp32 master weights).
ParamTable make_params(const ModelConfig& cfg, DType dtype, const ModelParts& parts = {},
                       Device device = Device::CPU);
ParamTable make_state(const ModelConfig& cfg, DType dtype, const ModelParts& parts = {},
                      Device device = Device::CPU);

// Typed handles into a table, resolved once (by slot, no name look-ups):
// what the model's code uses on every step.
// A KDA layer's tensors (Kimi's shapes: the convolutions [H K, 1, W],
// A_log [1, 1, H, 1]).
struct KdaParams {
  Param *q = nullptr, *k = nullptr, *v = nullptr, *q_conv = nullptr, *k_conv = nullptr,
        *v_conv = nullptr, *a_log = nullptr, *dt_bias = nullptr, *f_a = nullptr, *f_b = nullptr,
        *b = nullptr, *g_a = nullptr, *g_b = nullptr, *o_norm = nullptr, *o = nullptr;
};

// An MLA layer's (model.mla).
struct MlaParams {
  Param *q = nullptr, *kv_a = nullptr, *kv_norm = nullptr, *kv_b = nullptr, *o = nullptr;
};

struct LayerParams {
  Param *attn_norm = nullptr, *q = nullptr, *k = nullptr, *v = nullptr, *o = nullptr;
  Param *mlp_norm = nullptr, *gate = nullptr, *up = nullptr, *down = nullptr;  // dense MLP
  Param *attn_query = nullptr, *mlp_query = nullptr;  // AttnRes modes only
  // MoE layers: the router and its bias (aux_free only), the shared experts
  // (shared_experts > 0), and the routed experts held (ModelParts::expert_begin
  // on; indexed from 0 here, as their rows are: SublayerActs::moe_offsets).
  Param *router = nullptr, *router_bias = nullptr;
  Param *shared_gate = nullptr, *shared_up = nullptr, *shared_down = nullptr;
  std::vector<Param*> expert_gate, expert_up, expert_down;
  KdaParams kda;  // a KDA layer's (model.kda), in place of q, k, v, o
  MlaParams mla;  // an MLA layer's (model.mla), likewise
};
struct ModelParams {
  Param* embedding = nullptr;    // where the table holds it
  int64_t layer_begin = 0;       // layers[i] is transformer layer layer_begin + i
  std::vector<LayerParams> layers;
  Param* final_query = nullptr;  // AttnRes modes, with the head
  Param* final_norm = nullptr;
  Param* lm_head = nullptr;      // the output projection: the embedding when tied
};
// `params` and `state` must have been made by make_params and make_state
// (cfg, ..., parts, ...).
ModelParams resolve_params(ParamTable& params, ParamTable& state, const ModelConfig& cfg,
                           const ModelParts& parts);

}  // namespace attnres::model
