// Whole-model checks on the GPU: training steps on CUDA (fp32 and bf16) agree
// with the CPU model from the same initial weights, for every residual mode,
// and repeat bit for bit; bf16 logits track fp32 logits.
#include <catch2/catch.hpp>
#include <cstring>

#include "gpu_testing.h"
#include "model/model_testing.h"
#include "model/model.h"
#include "train/optimizer.h"

using namespace attnres;
using model::ModelConfig;
using model::ResidualMode;

namespace {

// A small model whose head dim (16) the CUDA attention kernels cover on both
// the fp32 and the tensor-core bf16 paths.
ModelConfig small(ResidualMode mode, int64_t block_size = 0, bool tie = false) {
  return testing::resized(testing::tiny(mode, block_size, 0, tie, 3), 97, 64, 4, 2, 96);
}

using Case = testing::NamedConfig;
// Full AttnRes deeper (12 sublayers: Mix groups of 4, merges of up to 3
// recent sources) and wider (d > 1024: the Mix kernels' block-per-row mode).
ModelConfig full_deep_wide(int64_t layers, int64_t d) {
  return testing::resized(testing::tiny(ResidualMode::Full, 0, 0, false, layers), 97, d, d / 16,
                          d / 32, 96);
}
// Mixture-of-experts layers on the small model (experts of width 32).
ModelConfig moe(ModelConfig c, int64_t experts, int64_t top_k, int64_t shared,
                kernels::MoeRouter router, model::MoeBalance balance, double capacity) {
  c = testing::with_moe(c, experts, top_k, shared, 1, router, balance);
  c.moe.expert_d_ff = 32;
  c.moe.capacity_factor = capacity;
  c.validate();
  return c;
}
std::vector<Case> cases() {
  return {{"baseline", small(ResidualMode::Baseline)},
          {"block S=2, MoE (sigmoid, a shared expert, aux-free bias)",
           moe(small(ResidualMode::Block, 2), 4, 2, 1, kernels::MoeRouter::Sigmoid,
               model::MoeBalance::AuxFree, 0)},
          {"full, MoE (softmax, aux loss, a capacity that drops)",
           moe(small(ResidualMode::Full), 6, 3, 0, kernels::MoeRouter::Softmax,
               model::MoeBalance::AuxLoss, 1.0)},
          {"full", small(ResidualMode::Full)},
          {"full, 6 layers (Mix groups of 4)", full_deep_wide(6, 64)},
          {"full, d = 1280 (block-mode Mix rows)", full_deep_wide(2, 1280)},
          {"block S=4 (uneven: final partial)", small(ResidualMode::Block, 4)},
          {"block S=2, tied embeddings", small(ResidualMode::Block, 2, true)},
          // Kimi Linear hybrids (model.kda, kernels/cuda/kda.cu): KDA in layer 1,
          // softmax GQA in 2 and 3.
          {"baseline, KDA hybrid", testing::with_kda(small(ResidualMode::Baseline), 2, 16, 3, 2)},
          {"block S=2, KDA hybrid with MoE",
           testing::with_kda(moe(small(ResidualMode::Block, 2), 4, 2, 1, kernels::MoeRouter::Sigmoid,
                                 model::MoeBalance::AuxFree, 0),
                             2, 16, 4, 2)},
          // ... with MLA softmax layers (kernels/cuda/mla.cu, attention_values.cu):
          // NoPE in a Block hybrid, RoPE on the dr dims in a Full model of MLA alone.
          {"block S=2, KDA + MLA hybrid (NoPE)",
           testing::with_mla(testing::with_kda(small(ResidualMode::Block, 2), 2, 16, 3, 2), 16, 8,
                             8, 12)},
          {"full, every layer MLA with RoPE",
           testing::with_mla(small(ResidualMode::Full), 16, 8, 8, 12, true)},
          // The residual variants and DenseFormer (kernels/cuda/mix_variant.cu).
          {"full, input query, sigmoid, 4 heads, window 3",
           testing::with_variant(small(ResidualMode::Full),
                                 testing::variant(model::MixQuery::Input, model::MixWeights::Attention,
                                                  kernels::MixScore::Sigmoid, true, 4, 3))},
          {"block S=2, scalar weights",
           testing::with_variant(small(ResidualMode::Block, 2),
                                 testing::variant(model::MixQuery::Static, model::MixWeights::Scalars))},
          {"block S=4, raw keys", testing::with_variant(small(ResidualMode::Block, 4),
                                                        testing::variant(model::MixQuery::Static,
                                                                         model::MixWeights::Attention,
                                                                         kernels::MixScore::Softmax, false))},
          {"denseformer", small(ResidualMode::DenseFormer)}};
}

// Per-step losses of `steps` AdamW steps with A microbatches of B x T tokens.
// With `repeat`, every step sees the same batch, so the loss must fall.
// The learning rate is 3e-3, or 3e-4 for the d = 1280 model: at 3e-3 its
// loss spikes (4.7, 4.1, 7.0, 3.8 on the CPU), and on such a path bf16 rounding
// alone moved the loss by 2.2% by step 4 (H100, 2026-11-22); at 3e-4 it falls
// smoothly and rounding the initial weights to bf16 moves it by under 0.1%.
std::vector<double> train_losses(model::Model& m, int steps, int64_t A, int64_t B, int64_t T,
                                 bool repeat = false) {
  train::OptimizerConfig oc;
  oc.lr = m.config().d_model > 256 ? 3e-4 : 3e-3;
  train::Optimizer opt(m.params(), oc);
  std::vector<double> losses;
  const int64_t V = m.config().vocab_size;
  for (int k = 0; k < steps; ++k) {
    m.params().zero_grads();
    double sum = 0;
    for (int64_t a = 0; a < A; ++a) {
      const uint64_t batch = repeat ? a : 10 * k + a;
      Tensor tok = testing::random_tokens(B * T, V, 100 + batch);
      Tensor tgt = testing::random_tokens(B * T, V, 500 + batch);
      sum += m.forward_backward(tok, tgt, B, T, 1.0 / (A * B * T));
    }
    opt.step(oc.lr, opt.grad_norm());
    losses.push_back(sum / (A * B * T));
  }
  return losses;
}

// The model of c on the CPU in fp32 and on the GPU in gpu_dtype, both
// initialised from seed: the same weights (for bf16, the GPU's fp32 master
// weights are the CPU's).
struct CpuGpu {
  model::Model cpu, gpu;
};
CpuGpu cpu_and_gpu(const ModelConfig& c, DType gpu_dtype, uint64_t seed) {
  CpuGpu m{model::Model(c, DType::F32), model::Model(c, gpu_dtype, {}, Device::CUDA)};
  m.cpu.params().init(seed);
  m.gpu.params().init(seed);
  return m;
}

}  // namespace

TEST_CASE("CUDA fp32 training steps match the CPU", "[gpu][model]") {
  for (const auto& tc : cases()) {
    SECTION(tc.name) {
      CpuGpu m = cpu_and_gpu(tc.cfg, DType::F32, 3);
      model::Model &cpu = m.cpu, &gpu = m.gpu;
      // Gradients of one microbatch, before any update.
      Tensor tok = testing::random_tokens(2 * 37, tc.cfg.vocab_size, 1);
      Tensor tgt = testing::random_tokens(2 * 37, tc.cfg.vocab_size, 2);
      cpu.params().zero_grads();
      gpu.params().zero_grads();
      const double lc = cpu.forward_backward(tok, tgt, 2, 37, 1.0);
      const double lg = gpu.forward_backward(tok, tgt, 2, 37, 1.0);
      CHECK(lg == Approx(lc).epsilon(1e-5));
      for (size_t i = 0; i < cpu.params().all().size(); ++i) {
        const auto& pc = cpu.params().all()[i];
        INFO(pc.name);
        CHECK(gpu_testing::rel_l2(gpu_testing::to_host_f32(gpu.params().all()[i].grad), pc.grad) < 1e-4);
      }
      // Then a few optimizer steps with two microbatches each.
      auto a = train_losses(cpu, 4, 2, 2, 37), b = train_losses(gpu, 4, 2, 2, 37);
      for (size_t k = 0; k < a.size(); ++k) CHECK(b[k] == Approx(a[k]).epsilon(1e-5));
      for (size_t i = 0; i < cpu.params().all().size(); ++i) {
        INFO(cpu.params().all()[i].name);
        CHECK(gpu_testing::rel_l2(gpu_testing::to_host_f32(gpu.params().all()[i].value),
                                  cpu.params().all()[i].value) < 1e-4);
      }
    }
  }
}

TEST_CASE("CUDA bf16 mixed-precision training tracks the fp32 CPU run", "[gpu][model]") {
  for (const auto& tc : cases()) {
    SECTION(tc.name) {
      CpuGpu m = cpu_and_gpu(tc.cfg, DType::BF16, 4);
      model::Model &cpu = m.cpu, &gpu = m.gpu;
      // The fp32 master weights start identical to the CPU's weights.
      for (size_t i = 0; i < cpu.params().all().size(); ++i)
        REQUIRE(gpu_testing::rel_l2(gpu_testing::to_host_f32(gpu.params().all()[i].master),
                                    cpu.params().all()[i].value) == 0);
      auto a = train_losses(cpu, 5, 2, 2, 64, true), b = train_losses(gpu, 5, 2, 2, 64, true);
      for (size_t k = 0; k < a.size(); ++k) {
        INFO("step " << k);
        CHECK(std::isfinite(b[k]));
        CHECK(b[k] == Approx(a[k]).epsilon(2e-2));
      }
      // Training did something, in both.
      CHECK(a.back() < a.front());
      CHECK(b.back() < b.front());
    }
  }
}

TEST_CASE("CUDA bf16 training with bf16 logits tracks fp32 logits", "[gpu][model]") {
  // The same bf16 model from the same weights, three ways: the LM head's
  // logits fp32 by default, fp32 asked for (training.logits = fp32: the same
  // bits), and bf16. V = 5003 (odd: the scalar row pass) so the softmax is
  // wide. bf16 rounds each logit by up to 2^-8 of it (logits of order 1
  // here): over 5 steps on one repeated batch that should move the loss far
  // less than the 2e-2 allowed between the bf16 run and the fp32 CPU run (the
  // test above); 5e-3 is a guess at that, not yet measured on a GPU.
  ModelConfig c = testing::resized(testing::tiny(ResidualMode::Block, 2, 0, false, 3), 5003, 64,
                                   4, 2, 96);
  model::Model dflt(c, DType::BF16, {}, Device::CUDA), f32(c, DType::BF16, {}, Device::CUDA),
      b16(c, DType::BF16, {}, Device::CUDA);
  f32.set_logits(DType::F32);
  b16.set_logits(DType::BF16);
  for (model::Model* m : {&dflt, &f32, &b16}) m->params().init(6);
  const auto a = train_losses(dflt, 5, 2, 2, 64, true), b = train_losses(f32, 5, 2, 2, 64, true),
             l = train_losses(b16, 5, 2, 2, 64, true);
  for (size_t k = 0; k < a.size(); ++k) {
    INFO("step " << k);
    CHECK(std::memcmp(&a[k], &b[k], sizeof(double)) == 0);
    CHECK(std::isfinite(l[k]));
    CHECK(l[k] == Approx(a[k]).epsilon(5e-3));
  }
  CHECK(l.front() != a.front());  // the bf16 path ran
  CHECK(l.back() < l.front());
  // An fp32 model has no bf16 logits.
  model::Model fp(c, DType::F32, {}, Device::CUDA);
  REQUIRE_THROWS_WITH(fp.set_logits(DType::BF16), Catch::Contains("bf16 logits need a bf16 model"));
}

TEST_CASE("CUDA training is deterministic run to run", "[gpu][model]") {
  for (DType dt : {DType::F32, DType::BF16}) {
    ModelConfig c = small(ResidualMode::Block, 2);
    model::Model m1(c, dt, {}, Device::CUDA), m2(c, dt, {}, Device::CUDA);
    m1.params().init(5);
    m2.params().init(5);
    auto a = train_losses(m1, 3, 2, 2, 64), b = train_losses(m2, 3, 2, 2, 64);
    INFO(dtype_name(dt));
    REQUIRE(a.size() == b.size());
    for (size_t k = 0; k < a.size(); ++k) CHECK(std::memcmp(&a[k], &b[k], sizeof(double)) == 0);
    for (size_t i = 0; i < m1.params().all().size(); ++i) {
      CHECK(testing::same_bits(m1.params().all()[i].weights(), m2.params().all()[i].weights()));
    }
  }
}

TEST_CASE("CUDA recomputation (mix, layer) gives training.recompute = none's bits",
          "[gpu][model][recompute]") {
  // The backward redoes the forward's kernels on the same inputs; on the GPU
  // that is bit-identical only if every kernel is deterministic (no atomics,
  // fixed reduction orders), which this checks over 3 AdamW steps.
  for (const auto& tc : cases()) {
    for (DType dt : {DType::F32, DType::BF16}) {
      model::Model ref(tc.cfg, dt, {}, Device::CUDA);
      ref.params().init(8);
      const auto want = train_losses(ref, 3, 2, 2, 48);
      for (model::Recompute r : {model::Recompute::Mix, model::Recompute::Layer}) {
        INFO(tc.name << ", " << dtype_name(dt) << ", recompute = " << model::recompute_name(r));
        model::Model m(tc.cfg, dt, {}, Device::CUDA);
        m.params().init(8);
        m.set_recompute(r);
        const auto got = train_losses(m, 3, 2, 2, 48);
        REQUIRE(got.size() == want.size());
        for (size_t k = 0; k < got.size(); ++k) {
          CHECK(std::isfinite(got[k]));
          CHECK(std::memcmp(&got[k], &want[k], sizeof(double)) == 0);
        }
        for (size_t i = 0; i < m.params().all().size(); ++i) {
          INFO(m.params().all()[i].name);
          CHECK(testing::same_bits(m.params().all()[i].weights(), ref.params().all()[i].weights()));
        }
      }
    }
  }
}

TEST_CASE("KV-cache decoding on CUDA matches the CPU", "[gpu][model]") {
  // A KDA layer (its fp32 state and convolution windows) beside GQA or MLA layers.
  for (const ModelConfig& c :
       {small(ResidualMode::Block, 4), testing::with_kda(small(ResidualMode::Block, 4), 2, 16, 3, 2),
        testing::with_mla(testing::with_kda(small(ResidualMode::Block, 4), 2, 16, 3, 2), 16, 8, 8,
                          12, true)}) {
    CpuGpu m = cpu_and_gpu(c, DType::F32, 6);
    model::Model &cpu = m.cpu, &gpu = m.gpu;
    auto cc = cpu.new_decode_cache(8), gc = gpu.new_decode_cache(8);
    for (int32_t t : {5, 17, 3, 88, 42}) {
      auto a = cpu.decode_step(t, cc), b = gpu.decode_step(t, gc);
      for (size_t i = 0; i < a.size(); ++i) CHECK(b[i] == Approx(a[i]).epsilon(1e-4).margin(1e-5));
    }
  }
}
