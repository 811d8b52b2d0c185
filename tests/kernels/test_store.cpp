// Store::Set (kernels/store.h): every backward op that takes it must write
// exactly what Store::Add adds into a zeroed buffer, without reading the old
// contents (the buffers start as NaN, which any read would carry through).
#include <catch2/catch.hpp>
#include <cmath>
#include <functional>
#include <limits>
#include <vector>

#include "kernels/attention.h"
#include "kernels/cross_entropy.h"
#include "kernels/matmul.h"
#include "kernels/rmsnorm.h"
#include "kernels/swiglu.h"
#include "testing.h"

using namespace attnres;
using namespace attnres::testing;
namespace kern = attnres::kernels;

namespace {

Tensor nan_filled(const Shape& shape, DType dt) {
  Tensor t = Tensor::empty(shape, dt);
  for (int64_t i = 0; i < t.numel(); ++i) set(t, i, std::numeric_limits<double>::quiet_NaN());
  return t;
}

// Runs `op` on gradient buffers of `shapes`: once zero-filled with Store::Add,
// once NaN-filled with Store::Set. The results must be equal element by
// element (+0 and -0 count as equal: 0 + -0 is +0).
void check_set_equals_add(const std::vector<Shape>& shapes, DType dt,
                          const std::function<void(std::vector<Tensor>&, kern::Store)>& op) {
  std::vector<Tensor> added, written;
  for (const Shape& s : shapes) {
    added.push_back(Tensor::zeros(s, dt));
    written.push_back(nan_filled(s, dt));
  }
  op(added, kern::Store::Add);
  op(written, kern::Store::Set);
  for (size_t b = 0; b < shapes.size(); ++b) {
    INFO("buffer " << b);
    int64_t differing = 0;
    for (int64_t i = 0; i < added[b].numel(); ++i)
      if (!(at(added[b], i) == at(written[b], i))) ++differing;  // NaN counts as differing
    REQUIRE(differing == 0);
    REQUIRE(added[b].numel() > 0);
  }
}

const DType kDtypes[] = {DType::F32, DType::F64};

}  // namespace

TEST_CASE("Store::Set writes what Store::Add adds to zeros: matmul", "[kernels]") {
  const int64_t M = 9, N = 7, K = 5;
  for (DType dt : kDtypes) {
    const Tensor x = randn({M, K}, 1, dt), w = randn({N, K}, 2, dt), dy = randn({M, N}, 3, dt);
    check_set_equals_add({{M, K}}, dt, [&](std::vector<Tensor>& g, kern::Store st) {
      Tensor dw = Tensor::zeros({N, K}, dt);
      kern::matmul_backward(&g[0], &dw, dy, x, w, st);
    });
    // N == 0: dx is an empty sum, = 0.
    const Tensor w0 = Tensor::empty({0, K}, dt), dy0 = Tensor::empty({M, 0}, dt);
    check_set_equals_add({{M, K}}, dt, [&](std::vector<Tensor>& g, kern::Store st) {
      kern::matmul_backward(&g[0], nullptr, dy0, x, w0, st);
    });
  }
}

TEST_CASE("Store::Set writes what Store::Add adds to zeros: swiglu", "[kernels]") {
  const int64_t N = 3, F = 37;
  for (DType dt : kDtypes) {
    const Tensor gu = randn({N, 2 * F}, 4, dt), dh = randn({N, F}, 6, dt);
    check_set_equals_add({{N, 2 * F}}, dt, [&](std::vector<Tensor>& g, kern::Store st) {
      kern::swiglu_backward(g[0], dh, gu, st);
    });
  }
}

TEST_CASE("Store::Set writes what Store::Add adds to zeros: rmsnorm", "[kernels]") {
  const int64_t N = 300, d = 24;  // more than one dgain row chunk
  for (DType dt : kDtypes) {
    const Tensor x = randn({N, d}, 7, dt), gain = randn({d}, 8, dt), dy = randn({N, d}, 9, dt);
    Tensor y = Tensor::empty({N, d}, dt), rstd = Tensor::empty({N}, dt);
    kern::rmsnorm_forward(y, rstd, x, &gain, 1e-5f);
    for (bool with_gain : {true, false})
      check_set_equals_add({{N, d}}, dt, [&](std::vector<Tensor>& g, kern::Store st) {
        Tensor dgain = Tensor::zeros({d}, dt);
        kern::rmsnorm_backward(g[0], with_gain ? &dgain : nullptr, dy, x, rstd,
                            with_gain ? &gain : nullptr, st);
      });
  }
}

TEST_CASE("Store::Set writes what Store::Add adds to zeros: attention", "[kernels]") {
  // GQA (2 query heads per KV head), two batches, T = 70: two query blocks of 64.
  const kern::AttnShape s{2, 70, 4, 2, 8};
  const int64_t N = s.B * s.T;
  for (DType dt : kDtypes) {
    const Tensor qkv = randn({N, kern::qkv_width(s)}, 10, dt), dout = randn({N, s.H * s.hd}, 13, dt);
    Tensor out = Tensor::empty({N, s.H * s.hd}, dt), lse = Tensor::empty({s.B, s.H, s.T}, dt);
    kern::attention_forward(out, lse, qkv, s);
    check_set_equals_add({{N, kern::qkv_width(s)}}, dt, [&](std::vector<Tensor>& g, kern::Store st) {
      kern::attention_backward(g[0], dout, qkv, out, lse, s, st);
    });
  }
}

TEST_CASE("Store::Set writes what Store::Add adds to zeros: cross-entropy dh", "[kernels]") {
  const int64_t N = 200, d = 6, V = 13;  // two row chunks of 128
  for (DType dt : kDtypes) {
    const Tensor h = randn({N, d}, 14, dt), w = randn({V, d}, 15, dt);
    const Tensor targets = random_tokens(N, V, 16);
    check_set_equals_add({{N, d}}, dt, [&](std::vector<Tensor>& g, kern::Store st) {
      Tensor dw = Tensor::zeros({V, d}, dt);
      kern::lm_head_cross_entropy(h, w, targets, &g[0], &dw, 0.5, st);
    });
  }
}
