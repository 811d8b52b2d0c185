// CUDA depth Mix of the residual variants and DenseFormer's averages
// (kernels/mix_variant.h) vs the CPU op run in F64 on the same values: every
// form (a shared query, a query per row, scalar logits, DenseFormer's
// weights; softmax or sigmoid; with or without the key norm; one head or
// four), F32 and BF16 (the parameters' gradients in fp32), forward (out and
// weights) and backward (every dsource and dquery, accumulated onto random
// values), a row wider than a warp's 32 lanes, k up to the 64-source
// capacity, aliased dsources, and the same bits on a second run.
#include <catch2/catch.hpp>
#include <cmath>
#include <string>
#include <vector>

#include "gpu_testing.h"
#include "kernels/mix_variant.h"
#include "mix_forms.h"

using namespace attnres;
namespace gt = attnres::gpu_testing;
namespace kern = attnres::kernels;
using kern::MixForm;
using kern::MixLogits;
using kern::MixScore;

namespace {

constexpr float kEps = 1e-5f;

void check_form(const MixForm& f, int64_t N, int64_t d, int64_t k, DType dt, uint64_t seed) {
  INFO(testing::mix_form_name(f) << ", N " << N << ", d " << d << ", k " << k << ", " << dtype_name(dt));
  const bool row_q = f.logits == MixLogits::RowQueries;
  std::vector<Tensor> src_h, src_d;
  for (int64_t j = 0; j < k; ++j) {
    src_h.push_back(gt::randn_f32({N, d}, seed + j, 0.5 + 0.4 * (j % 5)));
    src_d.push_back(gt::to_device(src_h.back(), dt));
  }
  Tensor q_h = gt::randn_f32(testing::mix_query_shape(f, N, d, k), seed + 100, 2.0 / std::sqrt(double(d)));
  const Tensor q_d = gt::to_device(q_h, dt);  // rows, or a parameter's value (bf16 in a bf16 run)
  std::vector<Tensor> src64;
  for (const Tensor& t : src_h) src64.push_back(t.to(DType::F64));
  const Tensor q64 = q_h.to(DType::F64);
  const int64_t H = f.heads;

  // Forward.
  Tensor out64 = Tensor::empty({N, d}, DType::F64), w64 = Tensor::empty({N, H, k}, DType::F64);
  kern::mix_variant_forward(out64, w64, q64, src64, f, kEps);
  Tensor out = gt::poisoned({N, d}, dt), wts = gt::poisoned({N, H, k}, DType::F32);
  kern::mix_variant_forward(out, wts, q_d, src_d, f, kEps);
  CHECK(gt::rel_l2(gt::host_f64(wts), w64) < 1e-5);
  CHECK(gt::rel_l2(gt::host_f64(out), out64) < gt::tol(dt));
  CHECK(gt::bf16_outliers(dt, gt::host_f64(out), out64, 2.0, gt::max_abs(out64), 0.05) == "");

  // Backward from the CPU's weights on both sides (the forward is checked above).
  Tensor dout_h = gt::randn_f32({N, d}, seed + 200);
  const Tensor dout_d = gt::to_device(dout_h, dt);
  std::vector<Tensor> ds64, ds_d, ds_before;
  for (int64_t j = 0; j < k; ++j) {
    Tensor r = gt::randn_f32({N, d}, seed + 300 + j);
    ds_d.push_back(gt::to_device(r, dt));
    ds_before.push_back(r.to(DType::F64));
    ds64.push_back(r.to(DType::F64));
  }
  Tensor dq_h = gt::randn_f32(q_h.shape(), seed + 400);
  Tensor dq_d = row_q ? gt::to_device(dq_h, dt) : dq_h.to(Device::CUDA);  // a parameter's: fp32
  Tensor dq64 = dq_h.to(DType::F64);
  const Tensor dq_before = dq64.clone();
  kern::mix_variant_backward(ds64, dq64, dout_h.to(DType::F64), q64, src64, w64, f, kEps);
  const Tensor w_d = w64.to(DType::F32).to(Device::CUDA);
  kern::mix_variant_backward(ds_d, dq_d, dout_d, q_d, src_d, w_d, f, kEps);
  for (int64_t j = 0; j < k; ++j) {
    INFO("dsource " << j);
    const Tensor got = gt::host_f64(ds_d[j]);
    CHECK(gt::rel_l2(gt::minus(got, ds_before[j]), gt::minus(ds64[j], ds_before[j])) < 10 * gt::tol(dt));
    CHECK(gt::bf16_outliers(dt, got, ds64[j], 2.0, gt::max_increment(ds64[j], ds_before[j]), 0.1) == "");
  }
  const Tensor dq_got = gt::host_f64(dq_d);
  CHECK(gt::rel_l2(gt::minus(dq_got, dq_before), gt::minus(dq64, dq_before)) <
        (row_q ? 10 * gt::tol(dt) : dt == DType::BF16 ? 2e-2 : 1e-4));

  // The same bits again (fixed reductions: the column sums in row order).
  Tensor dq2 = row_q ? gt::to_device(dq_h, dt) : dq_h.to(Device::CUDA);
  std::vector<Tensor> ds2;
  for (int64_t j = 0; j < k; ++j) {
    Tensor r = gt::randn_f32({N, d}, seed + 300 + j);
    ds2.push_back(gt::to_device(r, dt));
  }
  kern::mix_variant_backward(ds2, dq2, dout_d, q_d, src_d, w_d, f, kEps);
  CHECK(gt::same_bits(dq2, dq_d));
  for (int64_t j = 0; j < k; ++j) CHECK(gt::same_bits(ds2[j], ds_d[j]));
}

}  // namespace

TEST_CASE("cuda variant mix matches the CPU in every form", "[gpu][mix][variants]") {
  for (DType dt : {DType::F32, DType::BF16})
    for (const MixForm& f : testing::mix_forms()) check_form(f, 37, 96, 5, dt, 11);
}

TEST_CASE("cuda variant mix: wide rows, 64 sources, and aliased gradients", "[gpu][mix][variants]") {
  check_form(MixForm{MixLogits::Query, MixScore::Softmax, true, 2}, 300, 1100, 64, DType::F32, 21);
  check_form(MixForm{MixLogits::Weights}, 300, 1100, 64, DType::BF16, 22);
  // Aliased dsources: every source's gradient into one tensor = their sum.
  const int64_t N = 64, d = 128, k = 3;
  std::vector<Tensor> src;
  for (int64_t j = 0; j < k; ++j) {
    Tensor h = gt::randn_f32({N, d}, 30 + j);
    src.push_back(gt::to_device(h, DType::F32));
  }
  Tensor q = gt::randn_f32({d}, 40, 0.2);
  const Tensor q_d = q.to(Device::CUDA);
  const MixForm f{MixLogits::Query, MixScore::Sigmoid, true, 1};
  Tensor out = gt::poisoned({N, d}, DType::F32), w = gt::poisoned({N, 1, k}, DType::F32);
  kern::mix_variant_forward(out, w, q_d, src, f, kEps);
  Tensor dout = gt::randn_f32({N, d}, 41);
  const Tensor dout_d = dout.to(Device::CUDA);
  Tensor shared = Tensor::zeros({N, d}, DType::F32, Device::CUDA);
  std::vector<Tensor> aliased(k, shared), apart;
  for (int64_t j = 0; j < k; ++j) apart.push_back(Tensor::zeros({N, d}, DType::F32, Device::CUDA));
  Tensor dq1 = Tensor::zeros({d}, DType::F32, Device::CUDA), dq2 = dq1.clone();
  kern::mix_variant_backward(aliased, dq1, dout_d, q_d, src, w, f, kEps);
  kern::mix_variant_backward(apart, dq2, dout_d, q_d, src, w, f, kEps);
  Tensor sum = gt::host_f64(apart[0]);
  for (int64_t j = 1; j < k; ++j) sum = testing::sum_of(sum, gt::host_f64(apart[j]));
  CHECK(gt::rel_l2(gt::host_f64(shared), sum) < 1e-6);
}
