// CUDA embedding against the CPU op: the forward gather is exact, the backward
// scatter-add sums each table row's positions in ascending order (the CPU's
// order), so it is exact too and repeats bit for bit; ids outside [0, V) throw
// naming the first offending position, like the CPU.
#include <catch2/catch.hpp>
#include <vector>

#include "gpu_testing.h"
#include "kernels/embedding.h"

using namespace attnres;
using namespace attnres::gpu_testing;
namespace kern = attnres::kernels;

namespace {

// Token ids with a heavy head: about half the positions hold id 1, as in text.
Tensor skewed_tokens(int64_t n, int64_t V, uint64_t seed) {
  Tensor t = testing::random_tokens(n, V, seed);
  for (int64_t i = 0; i < n; ++i)
    if (random_u64(seed, 99, i) % 2 == 0) t.data<int32_t>()[i] = static_cast<int32_t>(1 % V);
  return t;
}

struct Size {
  int64_t V, d, N;
};
// The last one is big enough for CUB's multi-block sort and scan paths.
const Size kSizes[] = {{5, 12, 7}, {1, 1, 3}, {17, 64, 3000}, {50, 37, 200}, {300, 768, 1024},
                       {1000, 100, 0}, {50304, 24, 40000}};

// Runs body(dt, s, offset) in both dtypes, for every size, with the device
// tensors at their allocation's start and one element past it (misaligned).
template <typename Body>
void for_each_case(Body&& body) {
  for (DType dt : {DType::F32, DType::BF16})
    for (const Size& s : kSizes)
      for (bool offset : {false, true}) {
        INFO(dtype_name(dt) << " V=" << s.V << " d=" << s.d << " N=" << s.N << " offset=" << offset);
        body(dt, s, offset);
      }
}

}  // namespace

TEST_CASE("cuda embedding forward gathers exactly", "[gpu][embedding]") {
  for_each_case([](DType dt, const Size& s, bool offset) {
    Pair w = random_pair({s.V, s.d}, dt, 1, offset);
    Tensor tok = skewed_tokens(s.N, s.V, 2);
    Tensor out = poisoned_at({s.N, s.d}, dt, offset);
    kern::embedding_forward(out, w.dev, tok.to(Device::CUDA));
    Tensor out_cpu = Tensor::empty({s.N, s.d});
    kern::embedding_forward(out_cpu, w.host, tok);
    REQUIRE(same_bits(out.to(Device::CPU), out_cpu.to(dt)));
  });
}

TEST_CASE("cuda embedding backward matches the CPU bit for bit and repeats", "[gpu][embedding]") {
  for_each_case([](DType dt, const Size& s, bool offset) {
    Pair dout = random_pair({s.N, s.d}, dt, 3, offset);
    Pair dw0 = random_pair({s.V, s.d}, DType::F32, 4, offset);  // fp32 for bf16 dout too
    Tensor tok = skewed_tokens(s.N, s.V, 5);
    Tensor tok_dev = tok.to(Device::CUDA);

    Tensor dw_cpu = dw0.host.clone();
    kern::embedding_backward(dw_cpu, dout.host, tok);

    Tensor first;
    for (int rep = 0; rep < 2; ++rep) {
      Tensor dw = Tensor::empty({s.V * s.d + 1}, DType::F32, Device::CUDA)
                      .rows(offset ? 1 : 0, s.V * s.d)
                      .reshape({s.V, s.d});
      dw.copy_from(dw0.dev);  // accumulates into existing values
      kern::embedding_backward(dw, dout.dev, tok_dev);
      Tensor got = dw.to(Device::CPU);
      // Same additions in the same order as the CPU: identical bits.
      REQUIRE(same_bits(got, dw_cpu));
      if (rep == 0) first = got;
      else REQUIRE(same_bits(got, first));
    }
  });
}

TEST_CASE("cuda embedding rejects ids outside the vocabulary, naming the first", "[gpu][embedding]") {
  const int64_t V = 10, d = 8;
  Tensor w = randn_f32({V, d}, 1).to(Device::CUDA);
  Tensor out = Tensor::empty({6, d}, DType::F32, Device::CUDA);
  Tensor dw = Tensor::zeros({V, d}, DType::F32, Device::CUDA);
  Tensor dout = randn_f32({6, d}, 2).to(Device::CUDA);
  const std::vector<int32_t> ids_hi{1, 2, 3, 4, 10, 12};  // 10 at position 4 is the first
  const std::vector<int32_t> ids_neg{0, -1, 3, 99, 2, 1};
  Tensor hi = Tensor::from_vector(ids_hi, {6}).to(Device::CUDA);
  Tensor neg = Tensor::from_vector(ids_neg, {6}).to(Device::CUDA);
  REQUIRE_THROWS_WITH(kern::embedding_forward(out, w, hi),
                      "embedding_forward: token id 10 at position 4 is outside the vocabulary [0, 10)");
  REQUIRE_THROWS_WITH(kern::embedding_forward(out, w, neg),
                      "embedding_forward: token id -1 at position 1 is outside the vocabulary [0, 10)");
  REQUIRE_THROWS_WITH(kern::embedding_backward(dw, dout, hi),
                      "embedding_backward: token id 10 at position 4 is outside the vocabulary [0, 10)");
  REQUIRE_THROWS_WITH(kern::embedding_backward(dw, dout, neg),
                      "embedding_backward: token id -1 at position 1 is outside the vocabulary [0, 10)");
  // The backward checks before it writes: dweight is untouched.
  Tensor dw_host = dw.to(Device::CPU);
  for (int64_t i = 0; i < dw_host.numel(); ++i) REQUIRE(dw_host.data<float>()[i] == 0.f);
  // A later valid call works (no sticky error state).
  const std::vector<int32_t> ok{9, 0, 3, 3, 1, 2};
  REQUIRE_NOTHROW(kern::embedding_forward(out, w, Tensor::from_vector(ok, {6}).to(Device::CUDA)));
}
