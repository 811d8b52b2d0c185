// model::training_flops_per_token, which every MFU figure divides by, against
// counts made by hand (docs/model.md, "FLOPs per token"; the arithmetic is
// written out there step by step and was checked with a few lines of Python
// typed independently of src/model/flops.cpp): GPT-2 124M as
// configs/gpu_124m.json shapes it (SwiGLU with d_ff 2048, padded vocabulary
// 50304, untied head) and with GPT-2's own vocabulary 50257, and a Llama-7B
// shape, in the baseline and both AttnRes modes (whose depth Mix the count
// includes).
//
// The literals are exact: every count is a whole number below 2^53, so the
// double arithmetic of flops.cpp holds them exactly in any order, and an
// exact comparison cannot fail on rounding, only on a wrong count.
#include <catch2/catch.hpp>
#include <cstdint>

#include "model/config.h"
#include "model/flops.h"
#include "model/model_testing.h"

using namespace attnres;

namespace {

// Baseline, V x d embedding, L layers, H heads (as many KV heads), d_ff F.
model::ModelConfig shape(int64_t V, int64_t d, int64_t L, int64_t H, int64_t F) {
  model::ModelConfig c;
  c.n_layers = L;
  return testing::resized(c, V, d, H, H, F);
}

model::ModelConfig with_mode(model::ModelConfig c, model::ResidualMode mode, int64_t n_blocks = 0) {
  c.mode = mode;
  c.n_blocks = n_blocks;
  c.validate();
  return c;
}

}  // namespace

TEST_CASE("training FLOPs per token = hand counts for GPT-2 124M (our MLP)", "[flops]") {
  const int64_t T = 1024;
  // configs/gpu_124m.json: d 768, L 12, H 12, d_ff 2048, V 50304, untied.
  // Per layer q, k, v, o: 4 x 768 x 768 = 2,359,296; gate, up, down:
  // 3 x 2048 x 768 = 4,718,592; 12 layers: 84,934,656; LM head 50304 x 768 =
  // 38,633,472; matmul parameters 123,568,128.
  const model::ModelConfig gpt2 = shape(50304, 768, 12, 12, 2048);
  CHECK(model::matmul_params(gpt2) == 123568128.0);
  // 6 x 123,568,128 = 741,408,768, + attention 6 x 12 x 1024 x 768 =
  // 56,623,104: 798,031,872.
  CHECK(model::training_flops_per_token(gpt2, T) == 798031872.0);

  // A tied head is the embedding used as the LM head: the same GEMM, the same count.
  model::ModelConfig tied = gpt2;
  tied.tie_embeddings = true;
  CHECK(model::training_flops_per_token(tied, T) == 798031872.0);

  // GPT-2's unpadded vocabulary 50257: head 38,597,376, matmul parameters
  // 123,532,032; 741,192,192 + 56,623,104 = 797,815,296.
  CHECK(model::training_flops_per_token(shape(50257, 768, 12, 12, 2048), T) == 797815296.0);

  // Block AttnRes, N = 8 as the config has it: S = ceil(24 / 8) = 3; the 25
  // Mixes (24 sublayers + the final one) read 133 sources in all; 12 x 133 x
  // 768 = 1,225,728 more: 799,257,600.
  CHECK(model::training_flops_per_token(with_mode(gpt2, model::ResidualMode::Block, 8), T) ==
        799257600.0);
  // Full AttnRes: Mix s reads 1 + s sources, 25 + 300 = 325 in all; 12 x
  // 325 x 768 = 2,995,200 more: 801,027,072.
  CHECK(model::training_flops_per_token(with_mode(gpt2, model::ResidualMode::Full), T) ==
        801027072.0);

  // The residual variants (docs/model.md "Residual variants"), on Full:
  // an input query adds q = W v per Mix, 6 x 25 x 768^2 = 88,473,600:
  // 889,500,672; scalar weights drop the dots, 6 x 325 x 768 = 1,497,600 over
  // the baseline: 799,529,472; a window of 8 reads 1 + min(s, 8) sources,
  // 45 + 16 x 9 = 189 in all: 12 x 189 x 768 = 1,741,824 more: 799,773,696;
  // heads and a sigmoid split or score the same dots: Full's count.
  const model::ModelConfig full = with_mode(gpt2, model::ResidualMode::Full);
  using Q = model::MixQuery;
  using W = model::MixWeights;
  using Sc = kernels::MixScore;
  CHECK(model::training_flops_per_token(testing::with_variant(full, testing::variant(Q::Input)), T) ==
        889500672.0);
  CHECK(model::training_flops_per_token(
            testing::with_variant(full, testing::variant(Q::Static, W::Scalars)), T) == 799529472.0);
  CHECK(model::training_flops_per_token(
            testing::with_variant(full, testing::variant(Q::Static, W::Attention, Sc::Softmax, true, 1, 8)),
            T) == 799773696.0);
  CHECK(model::training_flops_per_token(
            testing::with_variant(full, testing::variant(Q::Static, W::Attention, Sc::Sigmoid, true, 4)),
            T) == 801027072.0);
  // DenseFormer: the averages before layers 1 .. 11 and the head's read
  // 2 + 3 + ... + 13 = 90 sources, a weighted add each: 6 x 90 x 768 =
  // 414,720 over the baseline: 798,446,592.
  CHECK(model::training_flops_per_token(with_mode(gpt2, model::ResidualMode::DenseFormer), T) ==
        798446592.0);
}

TEST_CASE("training FLOPs per token = hand counts for a Llama-7B shape", "[flops]") {
  const int64_t T = 2048;
  // d 4096, L 32, H 32 (no GQA), d_ff 11008, V 32000, untied. Per layer
  // 4 x 4096^2 = 67,108,864 + 3 x 11008 x 4096 = 135,266,304 = 202,375,168;
  // x 32 = 6,476,005,376; head 32000 x 4096 = 131,072,000; matmul
  // parameters 6,607,077,376.
  const model::ModelConfig llama = shape(32000, 4096, 32, 32, 11008);
  CHECK(model::matmul_params(llama) == 6607077376.0);
  // 6 x 6,607,077,376 = 39,642,464,256, + 6 x 32 x 2048 x 4096 =
  // 1,610,612,736: 41,253,076,992.
  CHECK(model::training_flops_per_token(llama, T) == 41253076992.0);
  // Block N = 8 (S = 8): each block of 8 Mixes reads (1 + b) + 7 (2 + b) =
  // 15 + 8b sources, over b = 0..7: 344, the final Mix 9: 353; 12 x 353 x
  // 4096 = 17,350,656 more: 41,270,427,648.
  CHECK(model::training_flops_per_token(with_mode(llama, model::ResidualMode::Block, 8), T) ==
        41270427648.0);
  // Full: 65 + (0 + ... + 64) = 2145 sources; 12 x 2145 x 4096 = 105,431,040
  // more: 41,358,508,032.
  CHECK(model::training_flops_per_token(with_mode(llama, model::ResidualMode::Full), T) ==
        41358508032.0);
}

TEST_CASE("training FLOPs per token = a hand count for a KDA hybrid (the quickstart's widths)",
          "[flops]") {
  // d 128, L 4, GQA 4 heads (2 KV) of 32, d_ff 352, V 4096, T 128; model.kda
  // H 4, K 32, W 4: layers 1-3 KDA, layer 4 softmax (docs/model.md):
  //  a KDA layer's matmuls: q, k, v 3 x 128 x 128 = 49,152; f_a, g_a 2 x 32 x
  //  128 = 8,192; f_b, g_b 2 x 128 x 32 = 8,192; b 4 x 128 = 512; o 16,384:
  //  82,432; the softmax layer's q, k, v, o 16,384 + 2 x 8,192 + 16,384 =
  //  49,152; MLPs 4 x 3 x 352 x 128 = 540,672; head 4096 x 128 = 524,288:
  //  P_mm = 3 x 82,432 + 49,152 + 540,672 + 524,288 = 1,361,408; 6 P_mm =
  //  8,168,448; softmax attention 6 x 128 x 128 = 98,304; the KDA core
  //  3 x 3 x (4 (6 x 32^2 + 5 x 64 x 32) + 6 x 4 x 4 x 32) = 9 x 68,608 =
  //  617,472. F = 8,884,224.
  model::ModelConfig c;
  c.n_layers = 4;
  c = testing::resized(c, 4096, 128, 4, 2, 352);
  c.kda.heads = 4, c.kda.head_dim = 32, c.kda.conv_size = 4;
  c.validate();
  CHECK(model::matmul_params(c) == 1361408.0);
  CHECK(model::kda_core_flops_per_token(c) == 68608.0);
  CHECK(model::training_flops_per_token(c, 128) == 8884224.0);
}

TEST_CASE("training FLOPs per token = a hand count for a KDA + MLA hybrid", "[flops]") {
  // The KDA hybrid above with its softmax layer (layer 4) as MLA: r 64, dn
  // 32, dr 16, dv 32, 4 heads. The MLA layer's matmuls: q_proj 4 x 48 x 128
  // = 24,576; kv_a_proj_with_mqa (64 + 16) x 128 = 10,240; kv_b_proj 4 x 64
  // x 64 = 16,384; o_proj 128 x 128 = 16,384: 67,584 (the latent norm is no
  // matmul). P_mm = 3 x 82,432 + 67,584 + 540,672 + 524,288 = 1,379,840;
  // 6 P_mm = 8,279,040; MLA's attention 3 x T H (dn + dr + dv) = 3 x 128 x 4
  // x 80 = 122,880; the KDA core as above 617,472. F = 9,019,392.
  model::ModelConfig c;
  c.n_layers = 4;
  c = testing::resized(c, 4096, 128, 4, 2, 352);
  c.kda.heads = 4, c.kda.head_dim = 32, c.kda.conv_size = 4;
  c.mla.kv_lora_rank = 64, c.mla.qk_nope_head_dim = 32, c.mla.qk_rope_head_dim = 16;
  c.mla.v_head_dim = 32;
  c.validate();
  CHECK(model::matmul_params(c) == 1379840.0);
  CHECK(model::training_flops_per_token(c, 128) == 9019392.0);
}
