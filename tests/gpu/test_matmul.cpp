// CUDA matmul (cuBLASLt) vs the CPU op run in F64 on the same values: forward
// (overwrite and accumulate), both gradients (accumulating into random
// values), optional gradients, odd and realistic shapes, F32 (true fp32, no
// TF32) and BF16 (F32 dw), row-slice operands that are not 256-byte aligned,
// the empty sum K = 0, and bitwise repeatability.
#include <catch2/catch.hpp>
#include <cmath>
#include <vector>

#include "gpu_testing.h"
#include "kernels/matmul.h"

using namespace attnres;
namespace gt = attnres::gpu_testing;
namespace kern = attnres::kernels;

namespace {

struct MatmulCase {
  int64_t M, N, K;
};

// Runs forward (+ accumulate) and backward on the GPU in `dt` and on the CPU in
// F64 from the same (bf16-rounded where dt is BF16) values; compares.
void check_matmul(const MatmulCase& c, DType dt, uint64_t seed) {
  INFO("M=" << c.M << " N=" << c.N << " K=" << c.K << " " << dtype_name(dt));
  const DType gdt = dt == DType::BF16 ? DType::F32 : dt;  // grad_dtype of the weights
  const double tol = gt::tol(dt);
  Tensor x = gt::randn_f32({c.M, c.K}, seed), w = gt::randn_f32({c.N, c.K}, seed + 1);
  Tensor dy = gt::randn_f32({c.M, c.N}, seed + 2);
  Tensor y0 = gt::randn_f32({c.M, c.N}, seed + 3);
  Tensor dx0 = gt::randn_f32({c.M, c.K}, seed + 4), dw0 = gt::randn_f32({c.N, c.K}, seed + 5);
  Tensor xd = gt::to_device(x, dt), wd = gt::to_device(w, dt), dyd = gt::to_device(dy, dt);
  Tensor y0d = gt::to_device(y0, dt), dx0d = gt::to_device(dx0, dt);
  Tensor dw0d = gt::to_device(dw0, gdt);

  // CPU reference in F64 on the (rounded) host values.
  Tensor x64 = x.to(DType::F64), w64 = w.to(DType::F64), dy64 = dy.to(DType::F64);
  Tensor yref = Tensor::empty({c.M, c.N}, DType::F64);
  kern::matmul_forward(yref, x64, w64);
  Tensor yacc_ref = y0.to(DType::F64);
  kern::matmul_forward(yacc_ref, x64, w64, &yacc_ref);
  Tensor dx_ref = dx0.to(DType::F64), dw_ref = dw0.to(DType::F64);
  kern::matmul_backward(&dx_ref, &dw_ref, dy64, x64, w64);
  // The terms behind each element, for the element-wise bf16 bound
  // (gpu_testing.h): the same ops on the magnitudes, |x| |W|^T, |y0| + |x|
  // |W|^T, |dx0| + |dy| |W|. The GEMM accumulates exact bf16 x bf16
  // products in fp32 (CUBLAS_COMPUTE_32F, split-K reductions in fp32 too:
  // kernels/cuda/gemm.cu) and rounds the output to bf16 once, so an element
  // is within 2^-8 |exact| + n 2^-23 (terms): c_ref = 2 and c_terms =
  // n 2^-15 (n 2^-23 in units of 2^-8), n the number of terms summed.
  const Tensor ax = testing::abs_of(x64), aw = testing::abs_of(w64);
  Tensor y_terms = Tensor::empty({c.M, c.N}, DType::F64);
  kern::matmul_forward(y_terms, ax, aw);
  Tensor yacc_terms = testing::abs_of(y0.to(DType::F64));
  kern::matmul_forward(yacc_terms, ax, aw, &yacc_terms);
  Tensor dx_terms = testing::abs_of(dx0.to(DType::F64));
  kern::matmul_backward(&dx_terms, nullptr, testing::abs_of(dy64), ax, aw);
  const double fwd_terms = std::ldexp(double(c.K + 1), -15), bwd_terms = std::ldexp(double(c.N + 1), -15);

  Tensor y = gt::poisoned({c.M, c.N}, dt);
  kern::matmul_forward(y, xd, wd);
  CHECK(gt::rel_l2(gt::to_host_f32(y), yref) < tol);
  CHECK(gt::bf16_outliers(dt, gt::to_host_f32(y), yref, 2, y_terms, fwd_terms) == "");

  Tensor yacc = y0d.clone();
  kern::matmul_forward(yacc, xd, wd, &yacc);
  CHECK(gt::rel_l2(gt::to_host_f32(yacc), yacc_ref) < tol);
  CHECK(gt::bf16_outliers(dt, gt::to_host_f32(yacc), yacc_ref, 2, yacc_terms, fwd_terms) == "");
  // A separate residual, read by the GEMM's epilogue: the same sum, written
  // over poison, the residual untouched.
  Tensor yres = gt::poisoned({c.M, c.N}, dt);
  kern::matmul_forward(yres, xd, wd, &y0d);
  CHECK(gt::rel_l2(gt::to_host_f32(yres), yacc_ref) < tol);
  CHECK(gt::bf16_outliers(dt, gt::to_host_f32(yres), yacc_ref, 2, yacc_terms, fwd_terms) == "");
  CHECK(gt::same_bits(y0d, gt::to_device(y0, dt)));

  Tensor dx = dx0d.clone(), dw = dw0d.clone();
  kern::matmul_backward(&dx, &dw, dyd, xd, wd);
  CHECK(gt::rel_l2(gt::to_host_f32(dx), dx_ref) < tol);
  CHECK(gt::bf16_outliers(dt, gt::to_host_f32(dx), dx_ref, 2, dx_terms, bwd_terms) == "");
  // W's row blocks (the joint [Wq; Wk; Wv]) change nothing on the GPU: one
  // GEMM either way, the same bits.
  if (c.N >= 2) {
    const std::vector<int64_t> halves{c.N / 2, c.N - c.N / 2};
    Tensor dxb = dx0d.clone(), dwb = dw0d.clone();
    kern::matmul_backward(&dxb, &dwb, dyd, xd, wd, kern::Store::Add, halves);
    CHECK(gt::same_bits(dxb, dx));
    CHECK(gt::same_bits(dwb, dw));
    Tensor y1 = Tensor::empty({c.M, c.N}, dt, Device::CUDA), y2 = y1.clone();
    kern::matmul_forward(y1, xd, wd);
    kern::matmul_forward(y2, xd, wd, nullptr, halves);
    CHECK(gt::same_bits(y1, y2));
  }
  // dw is F32 even for BF16 inputs: only the inputs' rounding (shared with
  // the reference) and fp32 accumulation separate it from the F64 result.
  CHECK(gt::rel_l2(gt::to_host_f32(dw), dw_ref) < gt::kTolF32 * (dt == DType::BF16 ? 10 : 1));

  // Each gradient alone gives the same bits as both together.
  Tensor dx_only = dx0d.clone(), dw_only = dw0d.clone();
  kern::matmul_backward(&dx_only, nullptr, dyd, xd, wd);
  kern::matmul_backward(nullptr, &dw_only, dyd, xd, wd);
  CHECK(gt::same_bits(dx_only, dx));
  CHECK(gt::same_bits(dw_only, dw));
}

}  // namespace

TEST_CASE("cuda matmul matches the CPU in F32 (true fp32) and BF16", "[gpu][matmul]") {
  const std::vector<MatmulCase> cases = {
      {13, 7, 36},     // nothing a multiple of a tile or a vector width
      {1, 1, 1},       // degenerate
      {64, 96, 128},   // tile-friendly
      {37, 50, 768},   // odd rows, realistic K
      {4096, 768, 768},  // a realistic projection (B*T = 4096, d = 768)
      {512, 2048, 768},  // an MLP up-projection shape
  };
  uint64_t seed = 100;
  for (const MatmulCase& c : cases)
    for (DType dt : {DType::F32, DType::BF16}) check_matmul(c, dt, seed += 10);
}

TEST_CASE("cuda matmul F32 is true fp32, not TF32", "[gpu][matmul]") {
  // TF32 keeps 10 mantissa bits: its error on K = 768 products of N(0,1)
  // values is ~5e-4 relative, fp32's ~1e-6. A 1e-5 bound tells them apart.
  const int64_t M = 256, N = 256, K = 768;
  Tensor x = gt::randn_f32({M, K}, 7), w = gt::randn_f32({N, K}, 8);
  Tensor y = gt::poisoned({M, N}, DType::F32);
  kern::matmul_forward(y, x.to(Device::CUDA), w.to(Device::CUDA));
  Tensor ref = Tensor::empty({M, N}, DType::F64);
  kern::matmul_forward(ref, x.to(DType::F64), w.to(DType::F64));
  REQUIRE(gt::rel_l2(gt::to_host_f32(y), ref) < 1e-5);
}

TEST_CASE("cuda matmul takes row slices that are not 256-byte aligned", "[gpu][matmul]") {
  // x = rows [1, 1 + M) of a larger tensor: its data starts K elements (72 or
  // 144 bytes) into the allocation, so cuBLASLt must not assume alignment.
  const int64_t M = 33, N = 19, K = 36;
  for (DType dt : {DType::F32, DType::BF16}) {
    INFO(dtype_name(dt));
    Tensor big = gt::randn_f32({M + 2, K}, 20), w = gt::randn_f32({N, K}, 21);
    Tensor bigd = gt::to_device(big, dt), wd = gt::to_device(w, dt);
    Tensor xd = bigd.rows(1, M);
    Tensor ybig = gt::poisoned({M + 1, N}, dt);
    Tensor y = ybig.rows(1, M);  // output offset by N elements too
    kern::matmul_forward(y, xd, wd);
    Tensor x64 = big.rows(1, M).to(DType::F64);
    Tensor ref = Tensor::empty({M, N}, DType::F64);
    kern::matmul_forward(ref, x64, w.to(DType::F64));
    CHECK(gt::rel_l2(gt::to_host_f32(y), ref) < gt::tol(dt));
    // Element-wise, as in check_matmul: the terms |x| |W|^T, one bf16 rounding.
    Tensor y_terms = Tensor::empty({M, N}, DType::F64);
    kern::matmul_forward(y_terms, testing::abs_of(x64), testing::abs_of(w.to(DType::F64)));
    CHECK(gt::bf16_outliers(dt, gt::to_host_f32(y), ref, 2, y_terms, std::ldexp(double(K), -15)) ==
          "");

    Tensor dy = gt::randn_f32({M, N}, 22);
    Tensor dyd = gt::to_device(dy, dt);
    Tensor dxbig = Tensor::zeros({M + 1, K}, dt, Device::CUDA);
    Tensor dx = dxbig.rows(1, M);
    kern::matmul_backward(&dx, nullptr, dyd, xd, wd);
    Tensor dx_ref = Tensor::zeros({M, K}, DType::F64);
    kern::matmul_backward(&dx_ref, nullptr, dy.to(DType::F64), x64, w.to(DType::F64));
    CHECK(gt::rel_l2(gt::to_host_f32(dx), dx_ref) < gt::tol(dt));
    Tensor dx_terms = Tensor::zeros({M, K}, DType::F64);
    kern::matmul_backward(&dx_terms, nullptr, testing::abs_of(dy.to(DType::F64)),
                          testing::abs_of(x64), testing::abs_of(w.to(DType::F64)));
    CHECK(gt::bf16_outliers(dt, gt::to_host_f32(dx), dx_ref, 2, dx_terms, std::ldexp(double(N), -15)) ==
          "");
  }
}

TEST_CASE("cuda matmul with K = 0 writes zeros, or the residual", "[gpu][matmul]") {
  const int64_t M = 5, N = 3;
  Tensor x = Tensor::empty({M, 0}, DType::F32, Device::CUDA);
  Tensor w = Tensor::empty({N, 0}, DType::F32, Device::CUDA);
  Tensor y = gt::poisoned({M, N}, DType::F32);
  kern::matmul_forward(y, x, w);
  Tensor h = y.to(Device::CPU);
  for (int64_t i = 0; i < h.numel(); ++i) REQUIRE(h.data<float>()[i] == 0.0f);
  Tensor y0 = gt::randn_f32({M, N}, 30);
  Tensor yacc = y0.to(Device::CUDA);
  kern::matmul_forward(yacc, x, w, &yacc);
  REQUIRE(gt::same_bits(yacc, y0));
  Tensor yres = gt::poisoned({M, N}, DType::F32), r = y0.to(Device::CUDA);
  kern::matmul_forward(yres, x, w, &r);
  REQUIRE(gt::same_bits(yres, y0));
}

TEST_CASE("cuda matmul is bitwise repeatable", "[gpu][matmul]") {
  const int64_t M = 1024, N = 768, K = 768;
  for (DType dt : {DType::F32, DType::BF16}) {
    INFO(dtype_name(dt));
    const DType gdt = dt == DType::BF16 ? DType::F32 : dt;
    Tensor x = gt::randn_f32({M, K}, 40), w = gt::randn_f32({N, K}, 41);
    Tensor dy = gt::randn_f32({M, N}, 42);
    Tensor xd = gt::to_device(x, dt), wd = gt::to_device(w, dt), dyd = gt::to_device(dy, dt);
    Tensor y[2], dx[2], dw[2];
    for (int r = 0; r < 2; ++r) {
      y[r] = gt::poisoned({M, N}, dt);
      kern::matmul_forward(y[r], xd, wd);
      dx[r] = Tensor::zeros({M, K}, dt, Device::CUDA);
      dw[r] = Tensor::zeros({N, K}, gdt, Device::CUDA);
      kern::matmul_backward(&dx[r], &dw[r], dyd, xd, wd);
    }
    CHECK(gt::same_bits(y[0], y[1]));
    CHECK(gt::same_bits(dx[0], dx[1]));
    CHECK(gt::same_bits(dw[0], dw[1]));
  }
}
