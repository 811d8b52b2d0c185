// CUDA reductions and elementwise helpers against the CPU ops: sum_squares
// (double, deterministic, independent of the tensor's alignment), scale_, add_,
// add, all_finite, convert (F32 <-> BF16, round to nearest even), in F32 and
// BF16, at sizes that are not multiples of the vector width and on row slices
// at unaligned offsets.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <limits>

#include "gpu_testing.h"
#include "kernels/reduce.h"

using namespace attnres;
using namespace attnres::gpu_testing;
namespace kern = attnres::kernels;

namespace {

const int64_t kSizes[] = {0, 1, 3, 8, 13, 1000, 4099, 100003};

}  // namespace

TEST_CASE("cuda sum_squares matches the CPU, is deterministic and alignment-independent", "[gpu][reduce]") {
  for (DType dt : {DType::F32, DType::BF16})
    for (int64_t n : {int64_t(0), int64_t(1), int64_t(7), int64_t(1000), int64_t(12345),
                      int64_t(1 << 20) + 3, int64_t(5000000)}) {
      INFO(dtype_name(dt) << " n=" << n);
      Pair p = random_pair({n}, dt, 11 + n, /*offset=*/false);
      const double cpu = kern::sum_squares(p.host);
      const double gpu = kern::sum_squares(p.dev);
      REQUIRE(std::fabs(gpu - cpu) <= 1e-12 * std::max(1.0, cpu));
      REQUIRE(kern::sum_squares(p.dev) == gpu);  // bitwise repeatable
      // The same values at an unaligned address give the same bits.
      Tensor big = Tensor::empty({n + 1}, dt, Device::CUDA);
      Tensor shifted = big.rows(1, n);
      shifted.copy_from(p.dev);
      REQUIRE(kern::sum_squares(shifted) == gpu);
    }
}

TEST_CASE("cuda scale_, add_ and add match the CPU", "[gpu][reduce]") {
  // layout 0: every tensor aligned (vector path); 1: every tensor one element
  // in; 2: mixed (one misaligned operand sends the op down the scalar path).
  for (DType dt : {DType::F32, DType::BF16})
    for (int layout : {0, 1, 2})
      for (int64_t n : kSizes) {
        INFO(dtype_name(dt) << " n=" << n << " layout=" << layout);
        Pair a = random_pair({n}, dt, 21 + n, layout == 1);
        Pair b = random_pair({n}, dt, 22 + n, layout >= 1);
        const int64_t out_begin = layout == 1 ? 1 : 0;

        // out = a + b; the CPU adds in fp32, which is the GPU's arithmetic, so
        // the results agree exactly once rounded to the device dtype.
        Tensor out_dev = poisoned({n + 1}, dt).rows(out_begin, n);
        kern::add(out_dev, a.dev, b.dev);
        Tensor out_cpu = Tensor::empty({n});
        kern::add(out_cpu, a.host, b.host);
        REQUIRE(same_bits(out_dev.to(Device::CPU), out_cpu.to(dt)));

        // y += x, in place.
        kern::add_(a.dev, b.dev);
        kern::add_(a.host, b.host);
        REQUIRE(same_bits(a.dev.to(Device::CPU), a.host.to(dt)));

        // x *= s (s rounded to float once, like the CPU).
        const double s = -0.3712345678901;
        kern::scale_(b.dev, s);
        kern::scale_(b.host, s);
        REQUIRE(same_bits(b.dev.to(Device::CPU), b.host.to(dt)));
      }
}

TEST_CASE("cuda all_finite finds any inf or nan", "[gpu][reduce]") {
  const float bad_values[] = {std::numeric_limits<float>::infinity(),
                              -std::numeric_limits<float>::infinity(),
                              std::numeric_limits<float>::quiet_NaN()};
  for (DType dt : {DType::F32, DType::BF16})
    for (bool offset : {false, true})
      for (int64_t n : kSizes) {
        INFO(dtype_name(dt) << " n=" << n << " offset=" << offset);
        // Large but finite values stay finite (in bf16 too).
        Pair p = random_pair({n}, dt, 31 + n, offset, 1e30);
        REQUIRE(kern::all_finite(p.dev));
        for (int64_t pos : {int64_t(0), n / 2, n - 1}) {
          if (n == 0) break;
          for (float bad : bad_values) {
            Tensor h = p.host.clone();
            h.data<float>()[pos] = bad;
            Tensor d = Tensor::empty({n + 1}, dt, Device::CUDA).rows(offset ? 1 : 0, n);
            d.copy_from(h.to(dt).to(Device::CUDA));
            INFO("bad " << bad << " at " << pos);
            REQUIRE_FALSE(kern::all_finite(d));
          }
        }
      }
}

TEST_CASE("cuda convert rounds F32 to BF16 to nearest even and widens exactly", "[gpu][reduce]") {
  for (bool offset : {false, true})
    for (int64_t n : kSizes) {
      INFO("n=" << n << " offset=" << offset);
      Pair p = random_pair({n}, DType::F32, 41 + n, offset);
      // Plant exact ties between two bf16 values (both parities), the largest
      // finite values, infinities and a denormal.
      float* h = p.host.data<float>();
      const float specials[] = {1.00390625f,  // 1 + 2^-8: tie, rounds down to even 1
                                1.01171875f,  // 1 + 3*2^-8: tie, rounds up to even
                                -1.00390625f, 3.3895313892515355e38f,
                                std::numeric_limits<float>::infinity(),
                                -std::numeric_limits<float>::infinity(), 1e-40f};
      for (int64_t i = 0; i < n && i < 7; ++i) h[i] = specials[i];
      p.dev.copy_from(p.host.to(Device::CUDA));

      Tensor lo = poisoned({n + 1}, DType::BF16).rows(offset ? 0 : 1, n);
      kern::convert(lo, p.dev);
      Tensor lo_host = lo.to(Device::CPU);
      REQUIRE(same_bits(lo_host, p.host.to(DType::BF16)));  // float_to_bf16: RNE

      Tensor back = poisoned_at({n}, DType::F32, offset);
      kern::convert(back, lo);
      REQUIRE(same_bits(back.to(Device::CPU), lo_host.to(DType::F32)));
    }
}

TEST_CASE("cuda sum_squares_each equals one sum_squares per tensor, bit for bit", "[gpu][reduce]") {
  // 70 F32 tensors (more than one launch batch of 64) of mixed sizes, empty
  // and misaligned ones included, then BF16 ones.
  std::vector<Tensor> xs;
  uint64_t seed = 900;
  const int64_t sizes[] = {1000, 0, 7, int64_t(1) << 20, 3, 768, 300001};
  for (int i = 0; i < 70; ++i) {
    const int64_t n = sizes[i % 7];
    xs.push_back(random_pair({n}, DType::F32, seed++, i % 5 == 4).dev);  // every fifth one misaligned
  }
  for (int64_t n : {int64_t(1000), int64_t(0), int64_t(1) << 20}) {
    Tensor h = randn_f32({n}, seed++);
    xs.push_back(to_device(h, DType::BF16));
  }
  const std::vector<double> each = kern::sum_squares_each(xs);
  REQUIRE(each.size() == xs.size());
  for (size_t i = 0; i < xs.size(); ++i) {
    INFO("tensor " << i);
    const double one = kern::sum_squares(xs[i]);
    REQUIRE(std::memcmp(&each[i], &one, sizeof one) == 0);
    // And the CPU value (fp32 inputs summed in double: only the order differs).
    const double cpu = kern::sum_squares(to_host_f32(xs[i]));
    REQUIRE(each[i] == Approx(cpu).epsilon(1e-12).margin(1e-300));
  }
}
