// Embedding lookup: forward gather, deterministic scatter-add backward, token
// validation.
#include <omp.h>

#include <catch2/catch.hpp>

#include "kernels/embedding.h"
#include "testing.h"

using namespace attnres;
using namespace attnres::testing;
namespace kern = attnres::kernels;

namespace {

Tensor tokens_from(const std::vector<int32_t>& ids) {
  return Tensor::from_vector(ids, {static_cast<int64_t>(ids.size())});
}

}  // namespace

TEST_CASE("embedding forward gathers rows", "[kernels]") {
  const int64_t V = 5, d = 12;
  Tensor w = randn({V, d}, 1);
  Tensor tok = tokens_from({3, 0, 4, 3, 1, 1, 2});  // repeats on purpose
  Tensor out = Tensor::empty({7, d}, DType::F64);
  kern::embedding_forward(out, w, tok);
  for (int64_t i = 0; i < 7; ++i)
    for (int64_t j = 0; j < d; ++j)
      REQUIRE(at(out, i * d + j) == at(w, tok.data<int32_t>()[i] * d + j));
}

TEST_CASE("embedding backward matches finite differences", "[kernels]") {
  const int64_t V = 6, d = 12, N = 13;  // N > V: tokens repeat
  Tensor w = randn({V, d}, 2);
  Tensor tok = random_tokens(N, V, 3);
  Tensor wt = randn({N, d}, 4);
  auto loss = [&] {
    Tensor out = Tensor::empty({N, d}, DType::F64);
    kern::embedding_forward(out, w, tok);
    return weighted_sum(out, wt);
  };
  Tensor dw = Tensor::zeros({V, d}, DType::F64);
  kern::embedding_backward(dw, wt, tok);
  REQUIRE(fd_check(w, dw, loss) < 1e-6);
}

TEST_CASE("embedding backward accumulates and float32 agrees with float64", "[kernels]") {
  const int64_t V = 9, d = 12, N = 31;
  Tensor tok = random_tokens(N, V, 5);
  Tensor dout = randn({N, d}, 6);
  Tensor dw = Tensor::zeros({V, d}, DType::F64);
  kern::embedding_backward(dw, dout, tok);
  Tensor once = dw.clone();
  kern::embedding_backward(dw, dout, tok);
  REQUIRE(scaled_diff(dw, sum_of(once, once)) < 1e-14);  // rows are sums that may cancel

  Tensor dw32 = Tensor::zeros({V, d}, DType::F32);
  kern::embedding_backward(dw32, dout.to(DType::F32), tok);
  REQUIRE(scaled_diff(dw32, once) < 1e-6);

  Tensor out32 = Tensor::empty({N, d}, DType::F32), out64 = Tensor::empty({N, d}, DType::F64);
  Tensor w = randn({V, d}, 7);
  kern::embedding_forward(out64, w, tok);
  kern::embedding_forward(out32, w.to(DType::F32), tok);
  REQUIRE(max_rel_diff(out32, out64) < 1e-7);
}

TEST_CASE("embedding backward is bitwise independent of the thread count", "[kernels]") {
  // Big enough to take the parallel path; few ids, so each row sums many positions.
  const int64_t V = 17, d = 64, N = 3000;
  Tensor tok = random_tokens(N, V, 8);
  Tensor dout = randn({N, d}, 9, DType::F32);
  const int saved = omp_get_max_threads();
  Tensor a = Tensor::zeros({V, d}, DType::F32), b = Tensor::zeros({V, d}, DType::F32);
  omp_set_num_threads(1);
  kern::embedding_backward(a, dout, tok);
  omp_set_num_threads(2);
  kern::embedding_backward(b, dout, tok);
  omp_set_num_threads(saved);
  REQUIRE(same_bits(a, b));

  // ...and equals the plain serial loop in position order.
  Tensor ref = Tensor::zeros({V, d}, DType::F32);
  for (int64_t i = 0; i < N; ++i)
    for (int64_t j = 0; j < d; ++j)
      ref.data<float>()[tok.data<int32_t>()[i] * d + j] += dout.data<float>()[i * d + j];
  REQUIRE(same_bits(a, ref));
}

TEST_CASE("embedding rejects bad token ids and shapes", "[kernels]") {
  const int64_t V = 5, d = 4;
  Tensor w = randn({V, d}, 10);
  Tensor out = Tensor::empty({4, d}, DType::F64);
  Tensor dw = Tensor::zeros({V, d}, DType::F64);
  Tensor dout = randn({4, d}, 11);

  Tensor too_big = tokens_from({0, 1, 2, 5});
  REQUIRE_THROWS_AS(kern::embedding_forward(out, w, too_big), Error);
  REQUIRE_THROWS_WITH(kern::embedding_forward(out, w, too_big),
                      Catch::Contains("token id 5 at position 3") && Catch::Contains("[0, 5)"));
  REQUIRE_THROWS_WITH(kern::embedding_backward(dw, dout, too_big),
                      Catch::Contains("embedding_backward") && Catch::Contains("position 3"));
  Tensor negative = tokens_from({0, -1, 2, 3});
  REQUIRE_THROWS_WITH(kern::embedding_forward(out, w, negative),
                      Catch::Contains("token id -1 at position 1"));

  Tensor ok = tokens_from({0, 1, 2, 3});
  Tensor bad_out = Tensor::empty({3, d}, DType::F64);
  REQUIRE_THROWS_WITH(kern::embedding_forward(bad_out, w, ok),
                      Catch::Contains("out has shape [3, 4], expected [4, 4]"));
  Tensor out32 = Tensor::empty({4, d}, DType::F32);
  REQUIRE_THROWS_WITH(kern::embedding_forward(out32, w, ok), Catch::Contains("out is F32, expected F64"));
  Tensor float_tokens = Tensor::zeros({4}, DType::F32);
  REQUIRE_THROWS_WITH(kern::embedding_forward(out, w, float_tokens),
                      Catch::Contains("tokens must be I32"));
  Tensor bad_dout = randn({4, d + 1}, 12);
  REQUIRE_THROWS_AS(kern::embedding_backward(dw, bad_dout, ok), Error);
}
