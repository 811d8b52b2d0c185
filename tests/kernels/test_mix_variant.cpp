// The residual variants' depth Mix (kernels/mix_variant.h): on the defaults it
// is the Mix of kernels/mix.h; each form (a shared query, a query per row,
// scalar logits; softmax or sigmoid; with or without the key norm; one head
// or several) against an explicit per-row transcription and its gradients
// against finite differences; aliased gradients, thread-count independence
// and the argument errors.
#include <omp.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <string>
#include <vector>

#include "kernels/mix.h"
#include "kernels/mix_variant.h"
#include "mix_forms.h"
#include "testing.h"

using namespace attnres;
using namespace attnres::testing;
namespace kern = attnres::kernels;
using kern::MixForm;
using kern::MixLogits;
using kern::MixScore;

namespace {

constexpr float kEps = 1e-5f;
constexpr double kH = 1e-5, kFloor = 1e-3;

std::vector<Tensor> sources_of(int64_t k, int64_t N, int64_t d, uint64_t seed,
                               DType dt = DType::F64) {
  std::vector<Tensor> v;
  for (int64_t j = 0; j < k; ++j) v.push_back(randn({N, d}, seed + j, dt, 0.5 + 0.4 * j));
  return v;
}

struct Out {
  Tensor out, weights;
};
Out run(const Tensor& q, const std::vector<Tensor>& src, const MixForm& f) {
  const int64_t N = src[0].dim(0), d = src[0].dim(1), k = static_cast<int64_t>(src.size());
  Out o{Tensor::empty({N, d}, src[0].dtype()), Tensor::empty({N, f.heads, k}, src[0].dtype())};
  kern::mix_variant_forward(o.out, o.weights, q, src, f, kEps);
  return o;
}

}  // namespace

TEST_CASE("variant mix on the defaults is the Mix of kernels/mix.h, forward and backward",
          "[kernels][variants]") {
  const int64_t N = 9, d = 12, k = 4;
  std::vector<Tensor> src = sources_of(k, N, d, 40);
  Tensor w = randn({d}, 41);
  std::vector<Tensor> rs;
  for (const Tensor& v : src) {
    rs.push_back(Tensor::empty({N}, DType::F64));
    kern::mix_source_rstd(rs.back(), v, kEps);
  }
  Tensor out = Tensor::empty({N, d}, DType::F64), probs = Tensor::empty({N, k}, DType::F64);
  kern::mix_forward(out, probs, w, src, rs);
  const Out v = run(w, src, MixForm{});
  REQUIRE(max_rel_diff(v.out, out, 1e-9) < 1e-13);
  REQUIRE(max_rel_diff(v.weights.reshape({N, k}), probs, 1e-9) < 1e-13);

  Tensor dout = randn({N, d}, 42);
  std::vector<Tensor> d1, d2;
  for (int j = 0; j < k; ++j) {
    d1.push_back(Tensor::zeros({N, d}, DType::F64));
    d2.push_back(Tensor::zeros({N, d}, DType::F64));
  }
  Tensor dw1 = Tensor::zeros({d}, DType::F64), dw2 = Tensor::zeros({d}, DType::F64);
  kern::mix_backward(d1, dw1, dout, w, src, rs, probs);
  kern::mix_variant_backward(d2, dw2, dout, w, src, v.weights, MixForm{}, kEps);
  REQUIRE(max_rel_diff(dw2, dw1, 1e-9) < 1e-12);
  for (int j = 0; j < k; ++j) REQUIRE(max_rel_diff(d2[j], d1[j], 1e-9) < 1e-12);
}

TEST_CASE("variant mix forward matches an explicit per-row, per-head transcription",
          "[kernels][variants]") {
  const int64_t N = 5, d = 8, k = 3;
  for (const MixForm& f : mix_forms()) {
    INFO(mix_form_name(f));
    std::vector<Tensor> src = sources_of(k, N, d, 50);
    const Tensor q = randn(mix_query_shape(f, N, d, k), 51, DType::F64, 0.7);
    const Out o = run(q, src, f);
    const int64_t H = f.heads, dh = d / H;
    for (int64_t n = 0; n < N; ++n)
      for (int64_t h = 0; h < H; ++h) {
        std::vector<double> z(k), a(k);
        for (int64_t j = 0; j < k; ++j) {
          double ss = 0, dot = 0;
          for (int64_t c = h * dh; c < (h + 1) * dh; ++c) ss += std::pow(at(src[j], n * d + c), 2);
          const double r = f.key_norm ? 1 / std::sqrt(ss / dh + kEps) : 1.0;
          for (int64_t c = h * dh; c < (h + 1) * dh; ++c) {
            const double qc = f.logits == MixLogits::RowQueries ? at(q, n * d + c) : at(q, c);
            dot += qc * at(src[j], n * d + c) * r;
          }
          z[j] = f.logits == MixLogits::Scalars || f.logits == MixLogits::Weights ? at(q, j) : dot;
        }
        double sum = 0;
        for (int64_t j = 0; j < k; ++j) sum += std::exp(z[j]);
        for (int64_t j = 0; j < k; ++j) {
          a[j] = f.logits == MixLogits::Weights ? z[j]
                 : f.score == MixScore::Sigmoid ? 1 / (1 + std::exp(-z[j]))
                                                : std::exp(z[j]) / sum;
          REQUIRE(at(o.weights, (n * H + h) * k + j) == Approx(a[j]).epsilon(1e-13));
        }
        for (int64_t c = h * dh; c < (h + 1) * dh; ++c) {
          double x = 0, terms = 0;
          for (int64_t j = 0; j < k; ++j) {
            x += a[j] * at(src[j], n * d + c);
            terms += std::fabs(a[j] * at(src[j], n * d + c));
          }
          REQUIRE(at(o.out, n * d + c) == approx_terms(x, 1e-14, terms));
        }
      }
  }
}

TEST_CASE("variant mix gradients match finite differences in every form", "[kernels][variants]") {
  const int64_t N = 5, d = 8, k = 3;
  for (const MixForm& f : mix_forms()) {
    INFO(mix_form_name(f));
    std::vector<Tensor> src = sources_of(k, N, d, 60);
    Tensor q = randn(mix_query_shape(f, N, d, k), 61, DType::F64, 0.7);
    const Tensor wt = randn({N, d}, 62);
    auto loss = [&] { return weighted_sum(run(q, src, f).out, wt); };
    const Out o = run(q, src, f);
    std::vector<Tensor> dsrc;
    for (int j = 0; j < k; ++j) dsrc.push_back(Tensor::zeros({N, d}, DType::F64));
    Tensor dq = Tensor::zeros(q.shape(), DType::F64);
    kern::mix_variant_backward(dsrc, dq, wt, q, src, o.weights, f, kEps);
    REQUIRE(fd_check(q, dq, loss, kH, kFloor) < 1e-6);
    for (int j = 0; j < k; ++j) {
      INFO("source " << j);
      REQUIRE(fd_check(src[j], dsrc[j], loss, kH, kFloor) < 1e-6);
    }
  }
}

TEST_CASE("variant mix: zero query or logits start at today's uniform weights, sigmoid at 1/2",
          "[kernels][variants]") {
  const int64_t N = 4, d = 8, k = 3;
  std::vector<Tensor> src = sources_of(k, N, d, 70);
  for (const MixForm& f : mix_forms()) {
    INFO(mix_form_name(f));
    if (f.logits == MixLogits::Weights) continue;  // zero weights: a zero output (DenseFormer starts at 1 0 .. 0)
    const Out o = run(Tensor::zeros(mix_query_shape(f, N, d, k), DType::F64), src, f);
    const double want = f.score == MixScore::Sigmoid ? 0.5 : 1.0 / k;
    for (int64_t i = 0; i < o.weights.numel(); ++i) REQUIRE(at(o.weights, i) == Approx(want));
  }
}

TEST_CASE("variant mix backward adds into aliased gradients and is thread-count independent",
          "[kernels][variants]") {
  const int64_t N = 700, d = 16, k = 3;  // three row chunks of the query's reduction
  for (const MixForm& f : {MixForm{MixLogits::Query, MixScore::Sigmoid, false, 2},
                           MixForm{MixLogits::Scalars, MixScore::Softmax, true, 1}}) {
    INFO(mix_form_name(f));
    std::vector<Tensor> src = sources_of(k, N, d, 80, DType::F32);
    const Tensor q = randn(mix_query_shape(f, N, d, k), 81, DType::F32, 0.5);
    const Tensor dout = randn({N, d}, 82, DType::F32);
    const Out o = run(q, src, f);
    auto grads = [&](int threads, bool alias) {
      const int saved = omp_get_max_threads();
      omp_set_num_threads(threads);
      Tensor shared = Tensor::zeros({N, d}, DType::F32), dq = Tensor::zeros(q.shape(), DType::F32);
      std::vector<Tensor> ds;
      for (int j = 0; j < k; ++j) ds.push_back(alias ? shared : Tensor::zeros({N, d}, DType::F32));
      kern::mix_variant_backward(ds, dq, dout, q, src, o.weights, f, kEps);
      omp_set_num_threads(saved);
      Tensor sum = Tensor::zeros({N, d}, DType::F32);
      if (!alias)
        for (const Tensor& t : ds) sum = sum_of(sum, t);
      return std::make_pair(alias ? shared : sum, dq);
    };
    const auto one = grads(1, false), two = grads(2, false), aliased = grads(2, true);
    REQUIRE(same_bits(one.second, two.second));
    REQUIRE(same_bits(one.first, two.first));
    REQUIRE(max_rel_diff(aliased.first, one.first, 1e-2) < 1e-5);  // float sums, two orders
  }
}

TEST_CASE("variant mix refuses heads that do not divide d and queries of the wrong shape",
          "[kernels][variants]") {
  std::vector<Tensor> src = sources_of(2, 3, 8, 90);
  Tensor out = Tensor::empty({3, 8}, DType::F64), wts = Tensor::empty({3, 3, 2}, DType::F64);
  REQUIRE_THROWS_WITH(kern::mix_variant_forward(out, wts, randn({8}, 1), src,
                                                MixForm{MixLogits::Query, MixScore::Softmax, true, 3},
                                                kEps),
                      Catch::Contains("3 heads do not divide d = 8"));
  Tensor w1 = Tensor::empty({3, 1, 2}, DType::F64);
  REQUIRE_THROWS_WITH(kern::mix_variant_forward(out, w1, randn({8}, 1), src,
                                                MixForm{MixLogits::Scalars}, kEps),
                      Catch::Contains("query"));
}
