// Every key of the model section, set away from its default, changes the
// function exactly as docs/model.md says (issue 43: a key that is parsed,
// checked and then not used). The other model tests run each key at its
// default (norm_eps 1e-5, rope_theta 10000, ...), where the model and the
// literal reference agree whether or not either reads the key. Here, for each
// key, on a small model with random weights:
//   (i)  the model (the loss, forward_backward's loss, the log-probabilities of
//        every token at every position, KV-cache decoding, the gradients by
//        finite differences) equals the reference (reference.h) at the
//        non-default value, and at the default;
//   (ii) the non-default value's log-probabilities differ from the default's
//        by more than 1e-3 (the comparisons above hold to 1e-11), in the model
//        and in the reference alike.
// A key that the model ignores fails (i); one that the reference ignores fails
// (i) too; one that both ignore fails (ii). The values are far from the
// defaults (norm_eps 0.5, rope_theta 7) so that the difference is large.
// tests/cli/export_hf_keys.sh checks the same settings through the trainer,
// the checkpoint and the Hugging Face export.
#include <catch2/catch.hpp>

#include <cmath>
#include <map>

#include "core/rng.h"
#include "model/model.h"
#include "model/model_testing.h"

using namespace attnres;
using model::ModelConfig;
using model::ResidualMode;

namespace {

constexpr int64_t kB = 2, kT = 5;
constexpr double kTol = 1e-11;     // model vs reference, log-probabilities (float64)
constexpr double kDiffers = 1e-3;  // a setting against the default: at least this far apart

// The model every case starts from: V 11, d 16, 4 query heads of 4 dims, 2 KV
// heads, F 12, L 3 (6 sublayers), untied; the keys the cases set at their defaults.
ModelConfig base(ResidualMode mode, int64_t block_size = 0, int64_t n_blocks = 0) {
  ModelConfig c;
  c.vocab_size = 11;
  c.d_model = 16;
  c.n_layers = 3;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.d_ff = 12;
  c.mode = mode;
  c.block_size = block_size;
  c.n_blocks = n_blocks;
  c.validate();
  return c;
}

ModelConfig with(ModelConfig c, const std::function<void(ModelConfig&)>& set) {
  set(c);
  c.validate();
  return c;
}

// Random values keyed by the parameter's name (and its size): two configs
// give the tensors they have in common the same values, so that a setting and
// the default compute with the same weights. Norm gains 1 + N(0, 0.3), the
// rest N(0, 0.5), the AttnRes queries included (no Mix is uniform).
void fill_by_name(model::ParamTable& t) {
  for (auto& p : t.all()) {
    testing::fill_normal(p.value, 3 ^ fnv1a64(p.name), 0.5);
    if (p.value.ndim() == 1 && p.name.find("norm.weight") != std::string::npos)
      for (int64_t j = 0; j < p.value.numel(); ++j)
        testing::set(p.value, j, 1.0 + 0.6 * testing::at(p.value, j));
  }
}

using Fill = std::function<void(model::ParamTable&)>;

const Tensor& tokens() {
  static const Tensor t = testing::random_tokens(kB * kT, 11, 1);
  return t;
}
const Tensor& targets() {
  static const Tensor t = testing::random_tokens(kB * kT, 11, 2);
  return t;
}

std::vector<int32_t> sequence(const Tensor& t, int64_t b) {
  return {t.data<int32_t>() + b * kT, t.data<int32_t>() + (b + 1) * kT};
}

// The reference's log p(v | position) for every position of the batch and
// every token v: [B*T*V].
std::vector<double> reference_logprobs(const ModelConfig& c, const model::ParamTable& params) {
  std::vector<double> out;
  for (int64_t b = 0; b < kB; ++b)
    for (const auto& row : reference::sequence_logits(c, testing::param_fn(params), sequence(tokens(), b)))
      for (double v : reference::log_softmax(row)) out.push_back(v);
  return out;
}

double reference_loss(const ModelConfig& c, const model::ParamTable& params) {
  double loss = 0;
  for (int64_t b = 0; b < kB; ++b)
    loss += reference::sequence_loss(c, testing::param_fn(params), sequence(tokens(), b),
                                     sequence(targets(), b));
  return loss;
}

// max |a - b| / max(1, |b|), NaN-safe; infinite when the sizes differ.
double worst_diff(const std::vector<double>& a, const std::vector<double>& b, size_t n = 0) {
  if (n == 0 && a.size() != b.size()) return INFINITY;
  if (n == 0) n = b.size();
  double worst = 0;
  for (size_t i = 0; i < n; ++i)
    worst = nan_max(worst, std::fabs(a[i] - b[i]) / std::max(1.0, std::fabs(b[i])));
  return worst;
}

// The model at config c with the weights `fill` gives, checked against the
// reference in every way (i) above; returns its log-probabilities [B*T*V].
std::vector<double> check_model(const ModelConfig& c, const Fill& fill = fill_by_name,
                                bool gradients = true) {
  model::Model m(c, DType::F64);
  fill(m.params());
  const int64_t V = c.vocab_size;
  const std::vector<double> want = reference_logprobs(c, m.params());
  const double want_loss = reference_loss(c, m.params());

  CHECK(m.forward_loss(tokens(), targets(), kB, kT) == Approx(want_loss).epsilon(1e-12));
  m.params().zero_grads();
  CHECK(m.forward_backward(tokens(), targets(), kB, kT, 1.0) == Approx(want_loss).epsilon(1e-12));

  // Every position, every token: the whole log-softmax (logits up to a constant).
  std::vector<int64_t> rows;
  std::vector<int32_t> tg;
  for (int64_t r = 0; r < kB * kT; ++r)
    for (int32_t v = 0; v < V; ++v) rows.push_back(r), tg.push_back(v);
  const std::vector<double> got = m.forward_logprobs(tokens(), kB, kT, rows, tg);
  const double d = worst_diff(got, want);
  INFO("log-probabilities: max |model - reference| / max(1, |ref|) = " << d);
  CHECK(d < kTol);

  // Decoding sequence 0 token by token with the KV cache (float logits).
  auto cache = m.new_decode_cache(kT);
  std::vector<double> dec;
  for (int64_t t = 0; t < kT; ++t) {
    const std::vector<float> logits = m.decode_step(tokens().data<int32_t>()[t], cache);
    for (double v : reference::log_softmax(reference::Vec(logits.begin(), logits.end())))
      dec.push_back(v);
  }
  const double dd = worst_diff(dec, want, static_cast<size_t>(kT * V));
  INFO("KV-cache decoding: max diff " << dd);
  CHECK(dd < 1e-5);

  if (gradients) {
    // The backward at this setting (RoPE's inverse rotation, the norms' and
    // Mixes' gradients, the tied head's share of the embedding gradient):
    // each parameter's gradient at three of its elements against a
    // fourth-order central difference (truncation ~h^4, round-off ~1e-16 /
    // h: both far below the bound).
    const Tensor tk = testing::random_tokens(kB * 3, V, 3), tt = testing::random_tokens(kB * 3, V, 4);
    m.params().zero_grads();
    m.forward_backward(tk, tt, kB, 3, 1.0);
    auto loss = [&]() { return m.forward_loss(tk, tt, kB, 3); };
    const double h = 1e-4;
    for (auto& p : m.params().all()) {
      const int64_t n = p.value.numel();
      for (int64_t i : {int64_t{0}, n / 2, n - 1}) {
        const double x = testing::at(p.value, i);
        double f[4];
        const double steps[4] = {2 * h, h, -h, -2 * h};
        for (int k = 0; k < 4; ++k) {
          testing::set(p.value, i, x + steps[k]);
          f[k] = loss();
        }
        testing::set(p.value, i, x);
        const double num = (-f[0] + 8 * f[1] - 8 * f[2] + f[3]) / (12 * h);
        const double ana = testing::at(p.grad, i);
        INFO("gradient of " << p.name << "[" << i << "]: analytic " << ana << ", numeric " << num);
        CHECK(std::fabs(ana - num) <= 1e-6 * std::max(1.0, std::fabs(num)));
      }
    }
  }
  return got;
}

// (ii): the setting's log-probabilities against the default's, the model's
// and the reference's (same weights where the two share tensors).
void check_differs(const ModelConfig& set, const ModelConfig& def, const std::vector<double>& model_set,
                   const std::vector<double>& model_def, const Fill& fill_set = fill_by_name,
                   const Fill& fill_def = fill_by_name) {
  model::ParamTable ps = model::make_params(set, DType::F64), pd = model::make_params(def, DType::F64);
  fill_set(ps);
  fill_def(pd);
  const double dr = worst_diff(reference_logprobs(set, ps), reference_logprobs(def, pd));
  const double dm = worst_diff(model_set, model_def);
  INFO("the setting against the default: reference " << dr << ", model " << dm);
  CHECK(dr > kDiffers);
  CHECK(dm > kDiffers);
}

struct KeyCase {
  const char* name;
  ModelConfig set, def;  // the key set, and at its default (or another value)
};

void run_cases(const std::vector<KeyCase>& cases) {
  for (const auto& kc : cases) {
    SECTION(kc.name) {
      const auto m_set = check_model(kc.set);
      const auto m_def = check_model(kc.def, fill_by_name, false);
      check_differs(kc.set, kc.def, m_set, m_def);
    }
  }
}

}  // namespace

TEST_CASE("model.norm_eps = 0.5: every RMSNorm and Mix key norm uses it, as the reference does",
          "[model][keys]") {
  auto eps = [](ModelConfig c) { return with(c, [](ModelConfig& m) { m.norm_eps = 0.5; }); };
  const ModelConfig b = base(ResidualMode::Baseline), f = base(ResidualMode::Full),
                    k = base(ResidualMode::Block, 4);
  run_cases({{"baseline (sublayer and final norms)", eps(b), b},
             {"full (and every Mix key norm)", eps(f), f},
             {"block S=4 (blocks of 4 and 2: the final Mix reads a partial sum)", eps(k), k}});
}

TEST_CASE("model.rope_theta = 7: queries and keys rotate at its frequencies, as the reference's",
          "[model][keys]") {
  auto theta = [](ModelConfig c) { return with(c, [](ModelConfig& m) { m.rope_theta = 7.0; }); };
  const ModelConfig b = base(ResidualMode::Baseline), k = base(ResidualMode::Block, 0, 2);
  run_cases({{"baseline", theta(b), b},
             {"block n_blocks=2", theta(k), k},
             {"rope_theta = 1e6 (above the default)",
              with(b, [](ModelConfig& m) { m.rope_theta = 1e6; }), b}});
}

TEST_CASE("model.tie_embeddings = true: the head is the embedding matrix, as the reference's",
          "[model][keys]") {
  // The untied default's lm_head holds its own random values.
  auto tie = [](ModelConfig c) { return with(c, [](ModelConfig& m) { m.tie_embeddings = true; }); };
  const ModelConfig b = base(ResidualMode::Baseline), f = base(ResidualMode::Full);
  run_cases({{"baseline", tie(b), b}, {"full", tie(f), f}});
}

TEST_CASE("model.n_heads: 4 heads of 4 dims against 2 of 8, the same weights", "[model][keys]") {
  auto heads = [](int64_t h) {
    return with(base(ResidualMode::Block, 2), [h](ModelConfig& m) { m.n_heads = m.n_kv_heads = h; });
  };
  run_cases({{"H = Hkv = 4 against H = Hkv = 2", heads(4), heads(2)}});
}

TEST_CASE("model.n_layers: 3 layers against the same first 2", "[model][keys]") {
  auto layers = [](int64_t l) {
    return with(base(ResidualMode::Full), [l](ModelConfig& m) { m.n_layers = l; });
  };
  run_cases({{"L = 3 against L = 2", layers(3), layers(2)}});
}

TEST_CASE("model.residual.mode: baseline, full and block compute what the reference does, and "
          "differ", "[model][keys]") {
  const ModelConfig b = base(ResidualMode::Baseline), f = base(ResidualMode::Full),
                    k = base(ResidualMode::Block, 2);
  run_cases({{"full against baseline (the default)", f, b},
             {"block S=2 against baseline", k, b},
             {"block S=2 against full", k, f}});
  SECTION("block with S = 1 is full AttnRes (docs/model.md)") {
    const auto one = check_model(base(ResidualMode::Block, 1), fill_by_name, false);
    const auto full = check_model(f, fill_by_name, false);
    CHECK(worst_diff(one, full) < kTol);
  }
}

TEST_CASE("model.residual.block_size and n_blocks: S sublayers per block, S = ceil(2L / N)",
          "[model][keys]") {
  // 2L = 6. Every block size gives its own function; n_blocks = N gives block
  // size ceil(6 / N)'s, never block size N's (N = 1 .. 6 all differ from
  // their ceil) nor floor(6 / N)'s where that differs (N = 4, 5).
  std::map<int64_t, std::vector<double>> by_size;
  for (int64_t S = 1; S <= 6; ++S) {
    INFO("block_size = " << S);
    by_size[S] = check_model(base(ResidualMode::Block, S), fill_by_name, S == 4);
  }
  for (int64_t S = 1; S < 6; ++S) {
    INFO("block_size " << S << " against " << S + 1);
    CHECK(worst_diff(by_size[S], by_size[S + 1]) > kDiffers);
  }
  for (int64_t N = 1; N <= 6; ++N) {
    INFO("n_blocks = " << N);
    const int64_t S = (6 + N - 1) / N;
    const auto got = check_model(base(ResidualMode::Block, 0, N), fill_by_name, N == 4);
    CHECK(worst_diff(got, by_size[S]) < kTol);
    CHECK(worst_diff(got, by_size[N]) > kDiffers);
    if (6 / N != S) CHECK(worst_diff(got, by_size[6 / N]) > kDiffers);
  }
  // The reference reads them itself (not through ModelConfig's resolved_block_size).
  ModelConfig c = base(ResidualMode::Block, 0, 4);
  CHECK(reference::block_size(c) == 2);
  c.n_blocks = 0, c.block_size = 5;
  CHECK(reference::block_size(c) == 5);
  CHECK(reference::block_size(base(ResidualMode::Full)) == 1);
}

TEST_CASE("model.n_kv_heads: grouped-query attention is multi-head attention with each KV head "
          "repeated for its group", "[model][keys]") {
  // docs/model.md: KV head j serves the query heads [j H/Hkv, (j+1) H/Hkv).
  // The GQA model with Hkv = 1 or 2 of H = 4 equals the MHA model (Hkv = 4,
  // the default) whose KV head h is GQA's head h / (H / Hkv); with KV heads
  // assigned the other way round (h mod Hkv) it differs.
  const int64_t H = 4, hd = 4, d = 16;
  for (int64_t Hkv : {int64_t{1}, int64_t{2}}) {
    DYNAMIC_SECTION("n_kv_heads = " << Hkv) {
      const ModelConfig gqa = with(base(ResidualMode::Block, 4), [&](ModelConfig& m) { m.n_kv_heads = Hkv; });
      const ModelConfig mha = with(gqa, [&](ModelConfig& m) { m.n_kv_heads = H; });
      model::ParamTable g = model::make_params(gqa, DType::F64);
      fill_by_name(g);
      // MHA weights from GQA's: KV head h's rows are GQA head kv_of(h)'s.
      auto expand = [&](bool grouped) -> Fill {
        return [&g, grouped, Hkv](model::ParamTable& t) {
          for (auto& p : t.all()) {
            const Tensor& src = g.get(p.name).value;
            if (src.numel() == p.value.numel()) {
              p.value.copy_from(src);
              continue;
            }
            for (int64_t h = 0; h < H; ++h) {
              const int64_t j = grouped ? h / (H / Hkv) : h % Hkv;
              for (int64_t i = 0; i < hd * d; ++i)
                testing::set(p.value, h * hd * d + i, testing::at(src, j * hd * d + i));
            }
          }
        };
      };
      const auto lp_gqa = check_model(gqa);
      const auto lp_mha = check_model(mha, expand(true), false);
      CHECK(worst_diff(lp_gqa, lp_mha) < kTol);
      if (Hkv > 1) {
        const auto lp_tiled = check_model(mha, expand(false), false);
        INFO("KV heads assigned h mod Hkv: max diff " << worst_diff(lp_tiled, lp_gqa));
        CHECK(worst_diff(lp_tiled, lp_gqa) > kDiffers);
      }
    }
  }
}

TEST_CASE("every key away from its default at once", "[model][keys]") {
  const ModelConfig def = base(ResidualMode::Block, 0, 4);
  const ModelConfig set = with(def, [](ModelConfig& m) {
    m.norm_eps = 0.5, m.rope_theta = 7.0, m.tie_embeddings = true, m.n_kv_heads = 1;
  });
  const auto m_set = check_model(set);
  const auto m_def = check_model(def, fill_by_name, false);
  check_differs(set, def, m_set, m_def);
}

TEST_CASE("the parameters are docs/model.md section 3's for the keys that shape them", "[model][keys]") {
  // Names and shapes written out from the table of docs/model.md section 3:
  // V, d, F, H hd, Hkv hd, L, the tie (no lm_head) and the mode (queries).
  auto want = [](const ModelConfig& c) {
    const int64_t V = c.vocab_size, d = c.d_model, F = c.d_ff, hd = c.d_model / c.n_heads;
    std::map<std::string, Shape> w{{"model.embed_tokens.weight", {V, d}}, {"model.norm.weight", {d}}};
    if (!c.tie_embeddings) w["lm_head.weight"] = {V, d};
    if (c.mode != ResidualMode::Baseline) w["model.final_res.query"] = {d};
    for (int64_t l = 0; l < c.n_layers; ++l) {
      const std::string p = "model.layers." + std::to_string(l) + ".";
      w[p + "input_layernorm.weight"] = {d};
      w[p + "post_attention_layernorm.weight"] = {d};
      w[p + "self_attn.q_proj.weight"] = {c.n_heads * hd, d};
      w[p + "self_attn.k_proj.weight"] = {c.n_kv_heads * hd, d};
      w[p + "self_attn.v_proj.weight"] = {c.n_kv_heads * hd, d};
      w[p + "self_attn.o_proj.weight"] = {d, c.n_heads * hd};
      w[p + "mlp.gate_proj.weight"] = {F, d};
      w[p + "mlp.up_proj.weight"] = {F, d};
      w[p + "mlp.down_proj.weight"] = {d, F};
      if (c.mode != ResidualMode::Baseline) {
        w[p + "attn_res.query"] = {d};
        w[p + "mlp_res.query"] = {d};
      }
    }
    return w;
  };
  const ModelConfig b = base(ResidualMode::Baseline);
  for (const ModelConfig& c :
       {b, base(ResidualMode::Full), base(ResidualMode::Block, 0, 4),
        with(b, [](ModelConfig& m) { m.tie_embeddings = true; }),
        with(b, [](ModelConfig& m) { m.vocab_size = 13, m.d_model = 24, m.d_ff = 20; }),
        with(b, [](ModelConfig& m) { m.n_heads = 2, m.n_kv_heads = 1, m.n_layers = 2; })}) {
    INFO("V " << c.vocab_size << " d " << c.d_model << " F " << c.d_ff << " H " << c.n_heads
              << " Hkv " << c.n_kv_heads << " L " << c.n_layers << " tied " << c.tie_embeddings
              << " mode " << model::residual_mode_name(c.mode));
    std::map<std::string, Shape> got;
    const model::ParamTable t = model::make_params(c, DType::F64);
    for (const auto& p : t.all()) got[p.name] = p.value.shape();
    CHECK(got == want(c));
  }
}
