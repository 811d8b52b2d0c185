// attnres bench: training throughput (forward + backward + AdamW) on
// synthetic tokens, the residual modes side by side, on the CPU or a GPU; and
// with --kernels, each op's time against its floors. A benchmark, not a test:
// it prints figures.
//
// Defaults are the CPU reference model: d=256, L=6, H=8,
// Hkv=4, d_ff=688, V=4096, T=256, B=8, Block AttnRes with S=4. The GPU
// presets (--preset 124m | 350m | 1b3) are configs/gpu_124m.json, gpu_350m.json
// and gpu_1b3.json's models (Block AttnRes with N=8); 1b3's micro-batch is the
// largest the GPU holds (--batch auto, sized by the memory planner). A default
// S or N larger than the model's 2L sublayers is cut to 2L, so --layers alone
// always gives a model that runs.
#include <functional>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "core/device.h"
#include "core/rng.h"
#include "kernels/attention.h"
#include "kernels/cpu/blas.h"
#include "model/flops.h"
#include "model/model.h"
#include "tools/bench_kda.h"
#include "tools/bench_kernels.h"
#include "tools/commands.h"
#include "tools/flags.h"
#include "train/config.h"
#include "train/memory.h"
#include "train/stepper.h"

namespace attnres::tools {

namespace {

Tensor random_ids(int64_t n, int64_t vocab, uint64_t stream) {
  Tensor t = Tensor::empty({n}, DType::I32);
  for (int64_t i = 0; i < n; ++i)
    t.data<int32_t>()[i] = static_cast<int32_t>(random_u64(3, stream, i) % vocab);
  return t;
}

// One row of the table: a residual mode, with a recomputation mode.
struct RunSpec {
  std::string label;
  model::ModelConfig cfg;
  model::Recompute recompute = model::Recompute::None;
  train::OptimizerType optimizer = train::OptimizerType::AdamW;
};

// One run's optimizer steps on fixed synthetic tokens, through the engine
// `attnres train` uses (train::Stepper on a single-process grid: the
// pipeline executor, runtime and AdamW), recording how long each whole step
// took: forward + backward of A microbatches, the gradient norm, AdamW.
class ModeRunner {
 public:
  ModeRunner(const RunSpec& run, int64_t B, int64_t T, int64_t A, Device device, DType dtype,
             train::Logits logits, kernels::AttentionKernel attention, bool graphs)
      : label_(run.label), cfg_(run.cfg), B_(B), T_(T), A_(A), device_(device),
        grid_(solo_, 1, 1),
        stepper_(grid_, config(run, B, T, A, device, dtype, logits, attention),
                 options(run, graphs)) {
    batch_.inputs = random_ids(B * T, run.cfg.vocab_size, 1);
    batch_.targets = random_ids(B * T, run.cfg.vocab_size, 2);
    stepper_.init_weights(1);
  }

  void step(bool timed) {
    const auto t0 = std::chrono::steady_clock::now();
    // The step's tensor high-water above what lives between steps (weights,
    // gradients, AdamW state): activations and workspace.
    const size_t resident = tensor_memory(device_).in_use;
    reset_tensor_peak(device_);
    stepper_.forward_backward(static_cast<int>(A_), [&](int) { return batch_; },
                              1.0 / static_cast<double>(A_ * B_ * T_));
    const double norm = stepper_.grad_norm();  // the norm returns to the host
    const auto t1 = std::chrono::steady_clock::now();
    stepper_.update(1e-4, norm);
    if (device_ == Device::CUDA) cuda::synchronize();
    if (timed)
      update_times_.push_back(
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count());
    act_peak_ = std::max(act_peak_, tensor_memory(device_).peak - resident);
    if (timed) times_.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  size_t activation_peak_bytes() const { return act_peak_; }
  const std::string& label() const { return label_; }
  // Median step time in seconds: robust to a machine busy with something else
  // for part of the run.
  double median_sec() const { return median(times_); }
  // The optimizer update's part of the step (AdamW, or Muon's Newton-Schulz too).
  double median_update_sec() const { return median(update_times_); }
  double tokens_per_step() const { return static_cast<double>(A_ * B_ * T_); }
  double flops_per_token() const { return model::training_flops_per_token(cfg_, T_); }

 private:
  static train::Config config(const RunSpec& run, int64_t B, int64_t T, int64_t A, Device device,
                              DType dtype, train::Logits logits,
                              kernels::AttentionKernel attention) {
    train::Config c;
    c.model = run.cfg;
    c.training.micro_batch_size = B, c.training.seq_len = T, c.training.grad_accum = A;
    c.training.device = device, c.training.precision = dtype, c.training.recompute = run.recompute;
    c.training.logits = logits;
    c.training.attention_kernel = attention;
    c.optimizer.type = run.optimizer;
    return c;
  }
  static parallel::RuntimeOptions options(const RunSpec& run, bool graphs) {
    parallel::RuntimeOptions ro;
    ro.recompute = run.recompute;
    ro.cuda_graphs = graphs;
    return ro;
  }

  std::string label_;
  model::ModelConfig cfg_;
  int64_t B_, T_, A_;
  Device device_;
  const parallel::Comm solo_ = parallel::Comm::solo();
  const parallel::ProcessGrid grid_;
  train::Stepper stepper_;
  data::TokenLoader::Batch batch_;
  std::vector<double> times_, update_times_;
  size_t act_peak_ = 0;
  static double median(std::vector<double> t) {
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
  }
};

// Bytes of GPU memory the runs need at micro-batch B, by the memory planner
// (train/memory.h), side by side (every run's resident state, plus the
// largest step's activations: the runs step in turn and a step frees its
// activations) and one at a time (the largest run's). The resident state is
// exact; the activation replay was within 5.2% of the measured high-water
// (docs/memory.md), so it gets 8%; and outside the replay are the
// cross-entropy's 1 GiB chunk of logits, cuBLASLt's workspaces and the pool's
// rounding, so 2 GiB more.
constexpr double kActivationMargin = 1.08;
constexpr double kGiB = 1073741824.0;
constexpr double kOutsidePlan = 2.0 * kGiB;
struct BenchMemory {
  double side_by_side = 0, one_at_a_time = 0;
};
BenchMemory plan_bench_memory(const std::vector<RunSpec>& runs, int64_t B, int64_t T, int64_t A,
                              Device device, DType dtype) {
  BenchMemory m;
  double activations = 0;
  for (const RunSpec& run : runs) {
    train::Config c;
    c.model = run.cfg;
    c.training.micro_batch_size = B, c.training.seq_len = T, c.training.grad_accum = A;
    c.training.device = device, c.training.precision = dtype, c.training.recompute = run.recompute;
    c.optimizer.type = run.optimizer;
    const train::RankMemory r = train::plan_memory(c).at(0);  // one rank: no pipeline here
    const double act = static_cast<double>(r.activations) * kActivationMargin;
    m.side_by_side += static_cast<double>(r.resident());
    activations = std::max(activations, act);
    m.one_at_a_time = std::max(m.one_at_a_time, static_cast<double>(r.resident()) + act + kOutsidePlan);
  }
  m.side_by_side += activations + kOutsidePlan;
  return m;
}

double gib(double bytes) { return bytes / kGiB; }

const char* kHelp =
    "usage: attnres bench [--device cpu|cuda] [--precision fp32|bf16] [--preset 124m|350m|1b3]\n"
    "  [--mode baseline|full|block|all] [--steps 5] [--warmup 1] [--d-model 256]\n"
    "  [--layers 6] [--heads 8] [--kv-heads 4] [--d-ff 688] [--vocab 4096] [--seq-len 256]\n"
    "  [--batch 8|auto] [--grad-accum 1] [--block-size 4 | --n-blocks N]\n"
    "  [--recompute none|mix|layer|all] [--logits auto|fp32|bf16] [--attention own|auto|cudnn]\n"
    "  [--cuda-graphs] [--kernels [--only TEXT]] [--moe E,K,Fe[,shared]] [--optimizer adamw|muon]\n"
    "  [--hybrid H,K[,conv] [--mla r,dn,dr,dv]] [--variants]\n"
    "  [--gpu-memory GiB] [--plan]\n"
    "       attnres bench --kda [--batch 1] [--seq-len 512] [--heads 4] [--head-dim 128] [--steps 5]\n"
    "Training throughput (forward, backward, AdamW) on synthetic tokens, one row per residual\n"
    "mode, on the CPU (the default) or a GPU (--device cuda). Block mode defaults to S = 4\n"
    "(a preset: N = 8), at most the model's 2L sublayers.\n"
    "--hybrid: a Kimi Linear hybrid (model.kda): KDA layers of H heads of width K, softmax\n"
    "attention in every 4th layer and the last (GQA, or MLA of latent r, dims dn + dr, dv with --mla).\n"
    "--moe: every layer's MLP a mixture of E experts of width Fe, K per token, plus `shared`\n"
    "shared experts (model.moe, dense_layers 0): the activated MLP of --d-ff (K + shared) Fe.\n"
    "--variants: the residual variants of the paper's Table 4 (model.residual) instead of the\n"
    "modes: Full, then Full with an input query, scalar weights, sigmoid, raw keys and a window\n"
    "of 8; Block S, with 16 heads (or the most that divide d) and with raw keys; DenseFormer;\n"
    "\"vs base\" is against Full (the first row).\n"
    "--optimizer: optimizer.type (muon: Muon for the layers' matrices); a line after the table\n"
    "gives each row's optimizer update (Newton-Schulz included) as its share of the step.\n"
    "--kernels times each CUDA op at the model's shapes against its floors\n"
    "(bytes / bandwidth, FLOPs / peak) instead of whole training steps;\n"
    "--only times just the ops whose row name contains TEXT, e.g. 'phase-1 bwd'.\n"
    "--batch auto (--preset 1b3's default): the largest micro-batch whose step fits the GPU\n"
    "with one mode in memory at a time, by the memory planner (attnres inspect memory),\n"
    "with 8% + 2 GiB to spare. The modes run side by side (their steps in turn) when the\n"
    "planner says they fit together, else one after another. --gpu-memory: plan for a GPU\n"
    "with that many GiB free instead of asking the device; --plan: print the plan and exit\n"
    "(no GPU needed with --gpu-memory).\n"
    "--recompute all runs each mode with none, mix and layer (training.recompute);\n"
    "--logits: the LM head's logits as training.logits (auto: bf16 in a bf16 run);\n"
    "--attention: which attention runs, as training.attention_kernel (own: ours);\n"
    "--cuda-graphs: each step as one CUDA graph (training.cuda_graphs = true): the first\n"
    "warm-up step runs eagerly, the second captures (at least 2 warm-up steps), the timed\n"
    "steps replay; the modes run one after another (a graph keeps its activations);\n"
    "the act MiB column is the step's tensor high-water above weights, gradients and\n"
    "AdamW state (activations and workspace), measured by the allocator.\n"
    "--kda times the KDA core on the CPU (kernels/kda.h): the chunkwise forward and backward\n"
    "and the token-by-token recurrence, each against its FLOP and byte floors.";

// --variants: Full and each of its Table 4 variants, then Block S and its
// own (heads: the paper's 16 where they divide d, else the most that do),
// then DenseFormer.
std::vector<RunSpec> variant_runs(const model::ModelConfig& c, int64_t S, model::Recompute r,
                                  train::OptimizerType optimizer) {
  using model::MixQuery;
  using model::MixWeights;
  std::vector<RunSpec> runs;
  auto add = [&](const std::string& label, model::ResidualMode mode,
                 const std::function<void(model::ResidualVariant&)>& set) {
    model::ModelConfig mc = c;
    mc.mode = mode;
    if (mode == model::ResidualMode::Block) mc.block_size = S;
    set(mc.variant);
    mc.validate();
    runs.push_back({label, mc, r, optimizer});
  };
  int64_t H = 16;
  while (c.d_model % H != 0) --H;
  const std::string block = "block S=" + std::to_string(S);
  add("full", model::ResidualMode::Full, [](model::ResidualVariant&) {});
  add("full + input query", model::ResidualMode::Full, [](auto& v) { v.query = MixQuery::Input; });
  add("full + scalar weights", model::ResidualMode::Full, [](auto& v) { v.weights = MixWeights::Scalars; });
  add("full + sigmoid", model::ResidualMode::Full, [](auto& v) { v.score = kernels::MixScore::Sigmoid; });
  add("full, raw keys", model::ResidualMode::Full, [](auto& v) { v.key_norm = false; });
  add("full, window 8", model::ResidualMode::Full, [](auto& v) { v.window = 8; });
  add(block, model::ResidualMode::Block, [](model::ResidualVariant&) {});
  add(block + " + " + std::to_string(H) + " heads", model::ResidualMode::Block,
      [H](auto& v) { v.heads = H; });
  add(block + ", raw keys", model::ResidualMode::Block, [](auto& v) { v.key_norm = false; });
  add("denseformer", model::ResidualMode::DenseFormer, [](model::ResidualVariant&) {});
  return runs;
}

}  // namespace

int cmd_bench(const Args& args) {
  Flags f(args, "bench",
          {"mode", "steps", "warmup", "d-model", "layers", "heads", "kv-heads", "d-ff", "vocab",
           "seq-len", "batch", "grad-accum", "block-size", "n-blocks", "device", "precision",
           "preset", "only", "recompute", "logits", "attention", "gpu-memory", "moe", "optimizer",
           "hybrid", "mla",
           "head-dim"},
          {"help", "kernels", "plan", "cuda-graphs", "kda", "variants"});
  if (f.has("help")) {
    std::puts(kHelp);
    return 0;
  }
  if (f.has("kda")) {
    const int64_t steps = f.get_int("steps", 5, "bench");
    if (steps < 1) fail("bench: --steps must be at least 1, got ", steps);
    tools::bench_kda(f.get_int("batch", 1, "bench"), f.get_int("seq-len", 512, "bench"),
                     f.get_int("heads", 4, "bench"), f.get_int("head-dim", 128, "bench"),
                     static_cast<int>(steps));
    return 0;
  }
  if (f.has("head-dim")) fail("bench: --head-dim is a flag of --kda");
  const std::string preset = f.get("preset", "");
  model::ModelConfig c;
  int64_t T = 256, B = 8, S = 4, NB = 0;
  if (preset == "124m") {  // GPT-2 small widths with Llama blocks
    c.d_model = 768, c.n_layers = 12, c.n_heads = 12, c.n_kv_heads = 12, c.d_ff = 2048;
    c.vocab_size = 50304, T = 1024, B = 16, NB = 8;
  } else if (preset == "350m") {
    c.d_model = 1024, c.n_layers = 24, c.n_heads = 16, c.n_kv_heads = 16, c.d_ff = 2816;
    c.vocab_size = 50304, T = 2048, B = 8, NB = 8;
  } else if (preset == "1b3") {  // B = 0: the largest the GPU holds (--batch auto)
    c.d_model = 2048, c.n_layers = 24, c.n_heads = 16, c.n_kv_heads = 8, c.d_ff = 5504;
    c.vocab_size = 50304, T = 2048, B = 0, NB = 8;
  } else if (!preset.empty()) {
    fail("bench: unknown --preset '", preset, "' (124m, 350m or 1b3)");
  } else {
    c.d_model = 256, c.n_layers = 6, c.n_heads = 8, c.n_kv_heads = 4, c.d_ff = 688;
    c.vocab_size = 4096;
  }
  c.d_model = f.get_int("d-model", c.d_model, "bench");
  c.n_layers = f.get_int("layers", c.n_layers, "bench");
  c.n_heads = f.get_int("heads", c.n_heads, "bench");
  c.n_kv_heads = f.get_int("kv-heads", c.n_kv_heads, "bench");
  c.d_ff = f.get_int("d-ff", c.d_ff, "bench");
  c.vocab_size = f.get_int("vocab", c.vocab_size, "bench");
  // "--flag a,b,c": its non-negative integers, between `lo` and `hi` of them.
  auto int_list = [&](const char* flag, size_t lo, size_t hi, const char* form) {
    std::vector<int64_t> v;
    const std::string text = f.get(flag, "");
    std::istringstream in(text);
    for (std::string x; std::getline(in, x, ',');) {
      char* end = nullptr;
      const long long n = std::strtoll(x.c_str(), &end, 10);
      if (x.empty() || *end != '\0' || n < 0)
        fail("bench: --", flag, " takes ", form, ", got '", text, "'");
      v.push_back(n);
    }
    if (v.size() < lo || v.size() > hi) fail("bench: --", flag, " takes ", form, ", got '", text, "'");
    return v;
  };
  if (f.has("moe")) {
    const auto v = int_list("moe", 3, 4, "E,K,Fe[,shared]");
    c.moe.experts = v[0], c.moe.top_k = v[1], c.moe.expert_d_ff = v[2];
    c.moe.shared_experts = v.size() == 4 ? v[3] : 0;
    c.moe.dense_layers = 0;
  }
  if (f.has("hybrid")) {  // Kimi Linear: KDA layers, softmax attention every 4 and in the last
    const auto v = int_list("hybrid", 2, 3, "H,K[,conv_size]");
    c.kda.heads = v[0], c.kda.head_dim = v[1];
    if (v.size() == 3) c.kda.conv_size = v[2];
    if (c.kda.heads < 1 || c.kda.head_dim < 1 || c.kda.conv_size < 1)
      fail("bench: --hybrid needs H, K and conv_size >= 1, got '", f.get("hybrid", ""), "'");
  }
  if (f.has("mla")) {  // the softmax layers as MLA (NoPE)
    const auto v = int_list("mla", 4, 4, "r,dn,dr,dv");
    c.mla.kv_lora_rank = v[0], c.mla.qk_nope_head_dim = v[1], c.mla.qk_rope_head_dim = v[2];
    c.mla.v_head_dim = v[3];
  }
  T = f.get_int("seq-len", T, "bench");
  const bool auto_batch = f.get("batch", B == 0 ? "auto" : "") == "auto";
  if (!auto_batch) B = f.get_int("batch", B, "bench");
  const int64_t A = f.get_int("grad-accum", 1, "bench");
  const int steps = static_cast<int>(f.get_int("steps", 5, "bench"));
  const int warmup = static_cast<int>(f.get_int("warmup", 1, "bench"));
  if (steps < 1) fail("bench: --steps must be at least 1 (the median of the timed steps), got ", steps);
  if (warmup < 0) fail("bench: --warmup must be 0 or more, got ", warmup);
  // The default S or N fits any depth: at most one block per sublayer.
  const int64_t sublayers = c.n_sublayers();
  NB = f.get_int("n-blocks", f.has("block-size") ? 0 : std::min(NB, sublayers), "bench");
  S = f.get_int("block-size", std::min(S, sublayers), "bench");
  const std::string which = f.get("mode", "all");
  if (f.has("only") && !f.has("kernels"))
    fail("bench: --only selects rows of --kernels; add --kernels");
  const Device device = train::parse_device(f.get("device", "cpu"), "bench: --device");
  const DType dtype = f.has("precision") ? train::parse_precision(f.get("precision", ""), "bench: --precision")
                      : device == Device::CUDA ? DType::BF16 : DType::F32;
  if (device == Device::CPU && dtype == DType::BF16) fail("bench: bf16 is a CUDA precision");
  const train::Logits logits_arg = train::parse_logits(f.get("logits", "auto"), "bench: --logits");
  if (logits_arg == train::Logits::BF16 && dtype != DType::BF16)
    fail("bench: --logits bf16 needs --precision bf16 (an fp32 run keeps fp32 logits)");
  const DType logits = train::logit_dtype(logits_arg, dtype);
  const kernels::AttentionKernel attention =
      train::parse_attention_kernel(f.get("attention", "own"), "bench: --attention");
  if (attention == kernels::AttentionKernel::Cudnn && device != Device::CUDA)
    fail("bench: --attention cudnn needs --device cuda");
  const double gpu_gib = f.get_double("gpu-memory", 0, "bench");
  if (f.has("gpu-memory") && !(gpu_gib > 0)) fail("bench: --gpu-memory must be a positive number of GiB");
  if (f.has("gpu-memory") && device != Device::CUDA) fail("bench: --gpu-memory plans for a GPU: add --device cuda");
  const bool plan_only = f.has("plan");
  if (device == Device::CUDA && cuda::device_count() == 0 && !(plan_only && f.has("gpu-memory")))
    fail("bench: --device cuda, but no CUDA device is visible",
         plan_only ? " (--plan --gpu-memory GiB plans without one)" : "");
  // The memory the runs may take on a GPU: --gpu-memory, or what it has free now.
  const double budget = device != Device::CUDA ? 0
                        : f.has("gpu-memory")  ? gpu_gib * kGiB
                                               : static_cast<double>(cuda::free_memory());
  if (auto_batch && budget == 0)
    fail("bench: --batch auto fits the micro-batch to a GPU's memory: add --device cuda");

  std::vector<model::Recompute> recomputes;
  if (const std::string r = f.get("recompute", "none"); r == "all")
    recomputes = {model::Recompute::None, model::Recompute::Mix, model::Recompute::Layer};
  else
    recomputes = {train::parse_recompute(r, "bench: --recompute (or all)")};
  const std::string opt_name = f.get("optimizer", "adamw");
  if (opt_name != "adamw" && opt_name != "muon")
    fail("bench: --optimizer must be adamw or muon, got '", opt_name, "'");
  const train::OptimizerType optimizer =
      opt_name == "muon" ? train::OptimizerType::Muon : train::OptimizerType::AdamW;
  std::vector<RunSpec> runs;
  const bool all = which == "all";
  const model::ResidualMode only = all ? model::ResidualMode::Baseline
                                       : model::parse_residual_mode(which, "bench: --mode (or all)");
  if (f.has("variants")) {
    if (f.has("mode")) fail("bench: --variants runs Full and Block with their variants; drop --mode");
    runs = variant_runs(c, S, recomputes.front(), optimizer);
  }
  for (const model::ResidualMode mode :
       {model::ResidualMode::Baseline, model::ResidualMode::Block, model::ResidualMode::Full}) {
    if (f.has("variants")) break;
    if (!all && mode != only) continue;
    model::ModelConfig mc = c;
    mc.mode = mode;
    std::string label = model::residual_mode_name(mode);
    if (mode == model::ResidualMode::Block) {
      if (NB > 0) {
        mc.n_blocks = NB;
        label += " N=" + std::to_string(NB);
      } else {
        mc.block_size = S;
        label += " S=" + std::to_string(S);
      }
    }
    mc.validate();
    for (model::Recompute r : recomputes)
      runs.push_back({recomputes.size() > 1 || r != model::Recompute::None
                          ? label + " rc=" + model::recompute_name(r)
                          : label,
                      mc, r, optimizer});
  }
  auto plan = [&](int64_t b) { return plan_bench_memory(runs, b, T, A, device, dtype); };
  if (auto_batch) {
    B = train::largest_fitting(1, 1, [&](int64_t b) { return plan(b).one_at_a_time <= budget; });
    if (B < 1)
      fail("bench: --batch auto: not even micro-batch 1 fits ", gib(budget), " GiB (one mode "
           "needs ", gib(plan(1).one_at_a_time), " GiB by the planner, with its margins)");
  }
  const BenchMemory need = plan(B);
  // Side by side unless the planner says the runs do not fit together.
  const bool graphs = f.has("cuda-graphs");
  if (graphs && device != Device::CUDA) fail("bench: --cuda-graphs needs --device cuda");
  if (graphs && warmup < 2)
    fail("bench: --cuda-graphs needs --warmup 2 or more (an eager step, then the capture), got ",
         warmup);
  const bool one_at_a_time = graphs || (budget > 0 && need.side_by_side > budget);

  double peak = 0;
  if (device == Device::CUDA && plan_only) {
    std::printf("attnres GPU benchmark plan, %s, %s logits\n", train::precision_name(dtype),
                train::precision_name(logits));
  } else if (device == Device::CUDA) {
    peak = cuda::peak_dense_flops(dtype == DType::BF16);
    std::printf("attnres GPU benchmark on %s, %s, %s logits\n", cuda::device_description().c_str(),
                train::precision_name(dtype), train::precision_name(logits));
  } else {
    std::printf("attnres CPU benchmark, %d OpenMP threads; BLAS: %s\n", omp_get_max_threads(),
                kernels::cpu::blas_description().c_str());
    for (const std::string& w : kernels::cpu::blas_warnings())
      std::printf("warning: %s\n", w.c_str());
  }
  if (device == Device::CUDA) {  // which attention runs (an error under cudnn where it cannot)
    std::string why;
    const bool cudnn = kernels::attention_uses_cudnn(
        attention, {std::max<int64_t>(B, 1), T, c.n_heads, c.n_kv_heads, c.head_dim()}, dtype,
        Device::CUDA, &why);
    std::printf("attention: %s\n", cudnn ? "cuDNN's fused attention" : ("ours (" + why + ")").c_str());
  }
  std::string moe =
      c.has_moe() ? fmt::format(" MoE E={} K={} Fe={} shared={}", c.moe.experts, c.moe.top_k,
                                c.moe.expert_d_ff, c.moe.shared_experts)
                  : "";
  if (c.has_kda()) {  // a hybrid: its KDA layers and what the softmax layers are
    int64_t kda_layers = 0;
    for (int64_t l = 0; l < c.n_layers; ++l) kda_layers += c.kda_layer(l);
    moe += fmt::format(" KDA {}x{} conv={} in {} of {} layers", c.kda.heads, c.kda.head_dim,
                       c.kda.conv_size, kda_layers, c.n_layers);
  }
  if (c.has_mla())
    moe += fmt::format(" MLA r={} dn={} dr={} dv={}", c.mla.kv_lora_rank, c.mla.qk_nope_head_dim,
                       c.mla.qk_rope_head_dim, c.mla.v_head_dim);
  std::printf("model: d=%lld L=%lld H=%lld Hkv=%lld d_ff=%lld%s V=%lld | T=%lld B=%lld A=%lld | "
              "median of %d timed steps after %d warm-up\n",
              (long long)c.d_model, (long long)c.n_layers, (long long)c.n_heads,
              (long long)c.n_kv_heads, (long long)c.d_ff, moe.c_str(), (long long)c.vocab_size,
              (long long)T, (long long)B, (long long)A, steps, warmup);
  // GiB needed by the planner (activations + 8%, + 2 GiB) against what there is.
  if (auto_batch)
    std::printf("micro-batch B=%lld: the largest whose step fits %.1f GiB with one mode in memory "
                "at a time (it needs %.1f GiB by the planner with its margins; B=%lld: %.1f GiB)\n",
                (long long)B, gib(budget), gib(need.one_at_a_time), (long long)(B + 1),
                gib(plan(B + 1).one_at_a_time));
  if (budget > 0 && !f.has("kernels")) {
    std::printf("modes %s (together they need %.1f GiB by the planner with its margins; %.1f GiB free)\n",
                one_at_a_time ? "one after another" : "side by side", gib(need.side_by_side),
                gib(budget));
    if (need.one_at_a_time > budget)
      std::printf("warning: the planner says one mode alone needs %.1f GiB: it may run out of "
                  "memory\n", gib(need.one_at_a_time));
  }
  if (plan_only) return 0;
  if (f.has("kernels")) {
    if (device != Device::CUDA) fail("bench --kernels times the CUDA ops: add --device cuda");
    bench_kernels(c, B, T, dtype, NB > 0 ? NB : std::min<int64_t>(8, sublayers), f.get("only", ""));
    return 0;
  }

  std::printf("%-26s %10s %12s %12s %8s %10s %10s\n", "mode", "step ms", "tokens/s",
              device == Device::CUDA ? "TFLOP/s" : "GFLOP/s", "MFU", "vs base", "act MiB");
  struct Result {
    std::string label;
    double sec, tokens, flops_per_token;
    size_t act_bytes;
    double update_sec;
  };
  std::vector<Result> results;
  auto result = [](const ModeRunner& r) {
    return Result{r.label(), r.median_sec(), r.tokens_per_step(), r.flops_per_token(),
                  r.activation_peak_bytes(), r.median_update_sec()};
  };
  // Warm-up, then the timed steps of `rs`, each step of each in turn. The
  // timed steps are the region a profiler started with profiling off records
  // (scripts/gpu_profile.sh: ncu --profile-from-start off).
  auto run_steps = [&](const std::vector<std::unique_ptr<ModeRunner>>& rs) {
    for (int i = 0; i < warmup + steps; ++i) {
      if (i == warmup && device == Device::CUDA) cuda::profiler_start();
      for (const auto& r : rs) r->step(/*timed=*/i >= warmup);
    }
    if (device == Device::CUDA) cuda::profiler_stop();
    for (const auto& r : rs) results.push_back(result(*r));
  };
  auto runner = [&](const RunSpec& run) {
    return std::make_unique<ModeRunner>(run, B, T, A, device, dtype, logits_arg, attention, graphs);
  };
  if (one_at_a_time) {
    // Each run's model lives only for its own steps.
    for (const RunSpec& run : runs) {
      std::vector<std::unique_ptr<ModeRunner>> one;
      one.push_back(runner(run));
      run_steps(one);
    }
  } else {
    // All runs live side by side and take their steps in turn (baseline,
    // block, full, baseline, ...), so a slow phase of the machine hits every
    // mode alike and the "vs base" column compares like with like.
    std::vector<std::unique_ptr<ModeRunner>> runners;
    for (const RunSpec& run : runs) runners.push_back(runner(run));
    run_steps(runners);
  }

  // "vs base": against the first row (the baseline with --mode all; the
  // mode without recomputation with --recompute all; Full with --variants).
  const double base_ms = results.size() > 1 ? results[0].sec * 1e3 : 0;
  for (size_t i = 0; i < results.size(); ++i) {
    const Result& r = results[i];
    const double ms = r.sec * 1e3;
    const double tps = r.tokens / r.sec, flops = tps * r.flops_per_token;
    char rel[32] = "-", mfu[32] = "-";
    if (base_ms > 0 && i > 0) std::snprintf(rel, sizeof rel, "%+.1f%%", 100.0 * (ms / base_ms - 1));
    if (peak > 0) std::snprintf(mfu, sizeof mfu, "%.1f%%", 100.0 * flops / peak);
    std::printf("%-26s %10.1f %12.0f %12.1f %8s %10s %10.2f\n", r.label.c_str(), ms, tps,
                device == Device::CUDA ? flops * 1e-12 : flops * 1e-9, mfu, rel,
                r.act_bytes / 1048576.0);
  }
  std::printf("optimizer update (%s), median ms and share of the step:",
              optimizer == train::OptimizerType::Muon ? "Muon + AdamW" : "AdamW");
  for (const Result& r : results)
    std::printf(" %s %.1f (%.1f%%);", r.label.c_str(), r.update_sec * 1e3,
                100.0 * r.update_sec / r.sec);
  std::printf("\n");
  if (device == Device::CUDA) {
    auto ms = cuda::memory_stats();
    std::printf("GPU memory: peak %.2f GiB in tensors, pool %.2f GiB\n", gib(double(ms.peak)),
                gib(double(ms.reserved)));
  }
  return 0;
}

}  // namespace attnres::tools
