// The parameter table: every trainable tensor with its docs/model.md section 3
// name, its gradient buffer and whether AdamW decays it.
#pragma once
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/tensor.h"
#include "model/config.h"

namespace attnres::model {

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

  // The full-precision weights: what the optimizer updates and checkpoints hold.
  Tensor& weights() { return master.defined() ? master : value; }
  const Tensor& weights() const { return master.defined() ? master : value; }
  // After weights() changed (load, init): value = master rounded to bf16.
  void sync_value();
};

class ParamTable {
 public:
  Param& add(const std::string& name, const Shape& shape, DType dtype, Device device,
             double init_std, double init_value = 0.0);
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

// Parameter names (Hugging Face Llama layout + AttnRes queries).
std::string layer_param(int64_t layer, const char* suffix);  // "model.layers.{l}.{suffix}"

// Which parts of the model a ParamTable holds: the pipeline gives each rank
// only its chunks' layers (plus the embedding / head where they live).
struct ModelParts {
  int64_t layer_begin = 0, layer_end = -1;  // [begin, end); end -1 = all layers
  bool embedding = true;
  bool head = true;
};

// Build the table for `cfg` restricted to `parts`, in a fixed order.
// dtype: F32 or F64 (CPU), F32 or BF16 (CUDA; BF16 adds fp32 master weights).
ParamTable make_params(const ModelConfig& cfg, DType dtype, const ModelParts& parts = {},
                       Device device = Device::CPU);

}  // namespace attnres::model
