// Store::Set on the CUDA backward ops (kernels/store.h): writing into a
// NaN-poisoned buffer must give what Store::Add gives into a zeroed one. The
// other GPU tests compare Store::Add with the CPU, so together they check
// Store::Set against the CPU. Hand-written kernels must agree exactly (the
// same arithmetic; +0 and -0 count as equal). GEMMs (matmul, the LM head)
// may pick a different cuBLASLt algorithm for beta = 0 than for beta = 1, so
// they are held to the dtype's tolerance.
#include <catch2/catch.hpp>
#include <functional>
#include <vector>

#include "gpu_testing.h"
#include "kernels/attention.h"
#include "kernels/cross_entropy.h"
#include "kernels/matmul.h"
#include "kernels/rmsnorm.h"
#include "kernels/swiglu.h"

using namespace attnres;
using namespace attnres::gpu_testing;
namespace kern = attnres::kernels;

namespace {

Tensor random_dev(const Shape& shape, DType dt, uint64_t seed) {
  Tensor h = randn_f32(shape, seed);
  return to_device(h, dt);
}

// Runs `op` on device gradient buffers of `shapes`: zeroed with Store::Add,
// poisoned with Store::Set; compares the results on the host.
void check_set_equals_add(const std::vector<Shape>& shapes, DType dt, bool exact,
                          const std::function<void(std::vector<Tensor>&, kern::Store)>& op) {
  std::vector<Tensor> added, written;
  for (const Shape& s : shapes) {
    added.push_back(Tensor::zeros(s, dt, Device::CUDA));
    written.push_back(poisoned(s, dt));
  }
  op(added, kern::Store::Add);
  op(written, kern::Store::Set);
  for (size_t b = 0; b < shapes.size(); ++b) {
    INFO("buffer " << b);
    const Tensor a = to_host_f32(added[b]), w = to_host_f32(written[b]);
    REQUIRE(a.numel() > 0);
    if (exact) {
      int64_t differing = 0;
      for (int64_t i = 0; i < a.numel(); ++i)
        if (!(testing::at(a, i) == testing::at(w, i))) ++differing;  // NaN differs
      REQUIRE(differing == 0);
    } else {
      REQUIRE(rel_l2(w, a) < (dt == DType::BF16 ? 1e-2 : 1e-6));
    }
  }
}

const DType kDtypes[] = {DType::F32, DType::BF16};

}  // namespace

TEST_CASE("cuda Store::Set equals Store::Add into zeros: swiglu", "[gpu][store]") {
  for (DType dt : kDtypes)
    for (int64_t F : {int64_t(37), int64_t(4096)}) {  // element by element, 16-byte packs
      INFO(dtype_name(dt) << " F=" << F);
      const Tensor gu = random_dev({3, 2 * F}, dt, 1), dh = random_dev({3, F}, dt, 3);
      check_set_equals_add({{3, 2 * F}}, dt, true, [&](std::vector<Tensor>& g, kern::Store st) {
        kern::swiglu_backward(g[0], dh, gu, st);
      });
    }
}

TEST_CASE("cuda Store::Set equals Store::Add into zeros: rmsnorm", "[gpu][store]") {
  struct Size {
    int64_t N, d;
  };
  // 768: vector path, dgain rows in shared memory; 7: scalar path; 13000:
  // dgain accumulators in global memory.
  for (DType dt : kDtypes)
    for (Size s : {Size{300, 768}, Size{45, 7}, Size{20, 13000}})
      for (bool with_gain : {true, false}) {
        INFO(dtype_name(dt) << " N=" << s.N << " d=" << s.d << " gain=" << with_gain);
        const Tensor x = random_dev({s.N, s.d}, dt, 4), gain = random_dev({s.d}, dt, 5);
        const Tensor dy = random_dev({s.N, s.d}, dt, 6);
        Tensor y = Tensor::empty({s.N, s.d}, dt, Device::CUDA);
        Tensor rstd = Tensor::empty({s.N}, DType::F32, Device::CUDA);
        kern::rmsnorm_forward(y, rstd, x, &gain, 1e-5f);
        check_set_equals_add({{s.N, s.d}}, dt, true, [&](std::vector<Tensor>& g, kern::Store st) {
          Tensor dgain = Tensor::zeros({s.d}, DType::F32, Device::CUDA);
          kern::rmsnorm_backward(g[0], with_gain ? &dgain : nullptr, dy, x, rstd,
                              with_gain ? &gain : nullptr, st);
        });
      }
}

TEST_CASE("cuda Store::Set equals Store::Add into zeros: attention", "[gpu][store]") {
  // BF16 hd 64 runs the tensor-core kernels, F32 and BF16 hd 24 the generic ones.
  for (DType dt : kDtypes)
    for (int64_t hd : {int64_t(64), int64_t(24)}) {
      const kern::AttnShape s{2, 150, 4, 2, hd};
      const int64_t N = s.B * s.T;
      INFO(dtype_name(dt) << " hd=" << hd);
      const Tensor qkv = random_dev({N, kern::qkv_width(s)}, dt, 7);
      const Tensor dout = random_dev({N, s.H * hd}, dt, 10);
      Tensor out = Tensor::empty({N, s.H * hd}, dt, Device::CUDA);
      Tensor lse = Tensor::empty({s.B, s.H, s.T}, DType::F32, Device::CUDA);
      kern::attention_forward(out, lse, qkv, s);
      check_set_equals_add({{N, kern::qkv_width(s)}}, dt, true,
                           [&](std::vector<Tensor>& g, kern::Store st) {
                             kern::attention_backward(g[0], dout, qkv, out, lse, s, st);
                           });
    }
}

TEST_CASE("cuda Store::Set equals Store::Add into zeros: matmul and LM head", "[gpu][store]") {
  for (DType dt : kDtypes) {
    INFO(dtype_name(dt));
    const DType gdt = dt == DType::BF16 ? DType::F32 : dt;
    const int64_t M = 96, N = 80, K = 64, V = 200;
    const Tensor x = random_dev({M, K}, dt, 11), w = random_dev({N, K}, dt, 12);
    const Tensor dy = random_dev({M, N}, dt, 13);
    check_set_equals_add({{M, K}}, dt, false, [&](std::vector<Tensor>& g, kern::Store st) {
      Tensor dw = Tensor::zeros({N, K}, gdt, Device::CUDA);
      kern::matmul_backward(&g[0], &dw, dy, x, w, st);
    });
    const Tensor wv = random_dev({V, K}, dt, 14);
    Tensor targets = testing::random_tokens(M, V, 15).to(Device::CUDA);
    check_set_equals_add({{M, K}}, dt, false, [&](std::vector<Tensor>& g, kern::Store st) {
      Tensor dw = Tensor::zeros({V, K}, gdt, Device::CUDA);
      kern::lm_head_cross_entropy(x, wv, targets, &g[0], &dw, 0.5, st);
    });
  }
}
