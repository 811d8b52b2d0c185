// CUDA KDA layer parts (kernels/kda.h, "the layer's per-token parts") against
// the CPU op run in F64 on the same values, forward and backward, F32 and
// BF16, Store::Add and Store::Set, aligned and misaligned tensors:
// - the convolution with W = 1, 3, 4 and 11 taps (past the dw kernel's 8 per
//   pass), T < W, B = 2 and 3 sequences of T rows that are not a multiple of
//   the 64-row partial blocks (a block then spans two sequences), more
//   channels than one 128-column tile; and, written out, that no sequence
//   reads the one before it (nor its dx the dy of the one after);
// - the per-head L2 norm and output gate with K under, at and past a warp,
//   several heads, more (row, head) items than one block takes, and K whose
//   dw accumulator rows leave fewer warps in shared memory, or none;
// - the decay with |f + dt_bias| past 20 (softplus's linear branch), several
//   heads and column tiles; beta.
// Parameter gradients (fp32 for BF16 values) are added onto random starting
// values, and every backward repeats bit for bit (fixed reduction orders).
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>

#include "gpu_testing.h"
#include "kernels/kda.h"

using namespace attnres;
using namespace attnres::gpu_testing;
namespace kern = attnres::kernels;

namespace {

const DType kDtypes[] = {DType::F32, DType::BF16};
const kern::Store kStores[] = {kern::Store::Add, kern::Store::Set};

const char* store_name(kern::Store s) { return s == kern::Store::Add ? "add" : "set"; }

Tensor f64(const Tensor& host) { return host.to(DType::F64); }

// A random host F32 start for a gradient (bf16 values for BF16).
Tensor random_start(const Shape& shape, DType dt, uint64_t seed) {
  return random_pair(shape, dt, seed, false).host;
}

// The device buffer an input gradient starts as: its start for Store::Add,
// NaN for Store::Set (never read).
Tensor in_grad_start(const Tensor& start, DType dt, bool offset, kern::Store store) {
  Tensor t = poisoned_at(start.shape(), dt, offset);
  if (store == kern::Store::Add) t.copy_from(start.to(dt).to(Device::CUDA));
  return t;
}

// A parameter gradient's device buffer (F32, grad_dtype of F32 and BF16
// values), always added into.
Tensor param_start(const Tensor& start, bool offset) {
  return in_grad_start(start, DType::F32, offset, kern::Store::Add);
}

// A freshly written forward output: rel_l2 within the dtype's tolerance and,
// in BF16, element by element (gpu_testing.h): the outputs here are products
// (of a norm's positive sum, a sigmoid, an exponential and a softplus), their
// fp32 error relative to themselves, rounded once to bf16: c_ref = 2, no terms.
void check_output(DType dt, const Tensor& dev, const Tensor& ref) {
  const Tensor got = to_host_f32(dev);
  REQUIRE(rel_l2(got, ref) < tol(dt));
  REQUIRE(bf16_outliers(dt, got, ref, 2, 0.0, 0) == "");
}

// An input gradient: rel_l2 within the dtype's tolerance and, in BF16, element
// by element: the stored value (start + increment with Store::Add, the
// increment with Set) is rounded once (c_ref = 2); the increments cancel (a
// norm's projection, the sum over the conv's taps) or are added onto the
// start, so the largest increment stands in for their terms, c_terms = 1.
void check_in_grad(DType dt, const Tensor& dev, const Tensor& ref, const Tensor& start,
                   kern::Store store) {
  const Tensor got = to_host_f32(dev);
  REQUIRE(rel_l2(got, ref) < tol(dt));
  const double scale = store == kern::Store::Add ? max_increment(ref, start) : max_abs(ref);
  REQUIRE(bf16_outliers(dt, got, ref, 2, scale, 1) == "");
}

// A parameter gradient: fp32 for either dtype, from the same (bf16-rounded)
// inputs as the reference: fp32 products summed in fixed blocks (and the
// blocks in double) against the exact sum, onto the same start; a kernel that
// wrote instead of adding would be off by the start, O(1) of the result.
void check_param(const Tensor& dev, const Tensor& ref) {
  REQUIRE(rel_l2(to_host_f32(dev), ref) < 1e-5);
}

// ---- the convolution ----

struct Conv {
  int64_t B, T, Ch, W;
};
const Conv kConvs[] = {{1, 1, 1, 1},   {2, 37, 5, 4},  {3, 70, 33, 4}, {2, 129, 64, 1},
                       {2, 3, 6, 4},   {2, 19, 7, 11}, {1, 150, 200, 3}};

// s_i of the pre-activation (host, F64): sum_j |w[c, j] x[t - W + 1 + j, c]|
// over the taps inside the sequence.
Tensor conv_terms(const Tensor& x, const Tensor& w, int64_t T) {
  const int64_t N = x.dim(0), Ch = x.dim(1), W = w.dim(1);
  Tensor s = Tensor::zeros(x.shape(), DType::F64);
  for (int64_t r = 0; r < N; ++r)
    for (int64_t c = 0; c < Ch; ++c)
      for (int64_t j = 0; j < W; ++j) {
        const int64_t back = W - 1 - j;
        if (back <= r % T)
          s.data<double>()[r * Ch + c] +=
              std::fabs(testing::at(w, c * W + j) * testing::at(x, (r - back) * Ch + c));
      }
  return s;
}

}  // namespace

TEST_CASE("cuda kda conv forward matches the CPU", "[gpu][kda]") {
  for (DType dt : kDtypes)
    for (Conv s : kConvs)
      for (bool offset : {false, true}) {
        INFO(dtype_name(dt) << " B=" << s.B << " T=" << s.T << " Ch=" << s.Ch << " W=" << s.W
                            << " offset=" << offset);
        const int64_t N = s.B * s.T;
        Pair x = random_pair({N, s.Ch}, dt, 1, offset);
        Pair w = random_pair({s.Ch, s.W}, dt, 2, offset, 0.5);
        Tensor y = poisoned_at({N, s.Ch}, dt, offset);
        kern::kda_conv_forward(y, x.dev, w.dev, s.B, s.T);
        Tensor y_ref = Tensor::empty({N, s.Ch}, DType::F64);
        kern::kda_conv_forward(y_ref, f64(x.host), f64(w.host), s.B, s.T);
        const Tensor got = to_host_f32(y);
        REQUIRE(rel_l2(got, y_ref) < tol(dt));
        // Element-wise: y = silu(p) rounded once (c_ref = 2); p is an fp32 sum
        // of W products, off by ~W 2^-24 of its terms (|silu'| <= 1.1), which
        // c_terms = 0.01 on the terms covers many times over.
        REQUIRE(bf16_outliers(dt, got, y_ref, 2, conv_terms(x.host, w.host, s.T), 0.01) == "");
      }
}

TEST_CASE("cuda kda conv backward matches the CPU and repeats bit for bit", "[gpu][kda]") {
  for (DType dt : kDtypes)
    for (Conv s : kConvs)
      for (kern::Store store : kStores)
        for (bool offset : {false, true}) {
          INFO(dtype_name(dt) << " B=" << s.B << " T=" << s.T << " Ch=" << s.Ch << " W=" << s.W
                              << " store=" << store_name(store) << " offset=" << offset);
          const int64_t N = s.B * s.T;
          Pair x = random_pair({N, s.Ch}, dt, 11, offset);
          Pair w = random_pair({s.Ch, s.W}, dt, 12, offset, 0.5);
          Pair dy = random_pair({N, s.Ch}, dt, 13, offset);
          const Tensor dx0 = random_start({N, s.Ch}, dt, 14);
          const Tensor dw0 = random_start({s.Ch, s.W}, DType::F32, 15);

          Tensor dx_ref = f64(dx0), dw_ref = f64(dw0);
          kern::kda_conv_backward(dx_ref, dw_ref, f64(dy.host), f64(x.host), f64(w.host), s.B, s.T,
                                  store);
          Tensor dx[2], dw[2];
          for (int rep = 0; rep < 2; ++rep) {
            dx[rep] = in_grad_start(dx0, dt, offset, store);
            dw[rep] = param_start(dw0, offset);
            kern::kda_conv_backward(dx[rep], dw[rep], dy.dev, x.dev, w.dev, s.B, s.T, store);
          }
          check_in_grad(dt, dx[0], dx_ref, dx0, store);
          check_param(dw[0], dw_ref);
          REQUIRE(same_bits(dx[0], dx[1]));
          REQUIRE(same_bits(dw[0], dw[1]));
        }
}

TEST_CASE("cuda kda conv: no sequence reads the one before it", "[gpu][kda]") {
  // B = 2: another first sequence leaves the second's y as it was, and
  // another dy on the second leaves the first's dx (the first's last rows'
  // taps would otherwise reach into the second's dy).
  const int64_t B = 2, T = 9, Ch = 6, W = 4, N = B * T;
  for (DType dt : kDtypes) {
    INFO(dtype_name(dt));
    Pair x = random_pair({N, Ch}, dt, 21, false), x_other = random_pair({N, Ch}, dt, 22, false);
    Pair w = random_pair({Ch, W}, dt, 23, false, 0.5);
    Pair dy = random_pair({N, Ch}, dt, 24, false), dy_other = random_pair({N, Ch}, dt, 25, false);
    const Tensor x2 =
        Tensor::joined_rows({x_other.host.rows(0, T), x.host.rows(T, T)}).to(dt).to(Device::CUDA);
    const Tensor dy2 =
        Tensor::joined_rows({dy.host.rows(0, T), dy_other.host.rows(T, T)}).to(dt).to(Device::CUDA);

    Tensor y1 = poisoned({N, Ch}, dt), y2 = poisoned({N, Ch}, dt);
    kern::kda_conv_forward(y1, x.dev, w.dev, B, T);
    kern::kda_conv_forward(y2, x2, w.dev, B, T);
    REQUIRE(same_bits(y1.rows(T, T), y2.rows(T, T)));
    REQUIRE_FALSE(same_bits(y1.rows(0, T), y2.rows(0, T)));  // the change reached the first

    Tensor dx1 = poisoned({N, Ch}, dt), dx2 = poisoned({N, Ch}, dt);
    Tensor dw1 = Tensor::zeros({Ch, W}, DType::F32, Device::CUDA);
    Tensor dw2 = Tensor::zeros({Ch, W}, DType::F32, Device::CUDA);
    kern::kda_conv_backward(dx1, dw1, dy.dev, x.dev, w.dev, B, T, kern::Store::Set);
    kern::kda_conv_backward(dx2, dw2, dy2, x.dev, w.dev, B, T, kern::Store::Set);
    REQUIRE(same_bits(dx1.rows(0, T), dx2.rows(0, T)));
    REQUIRE_FALSE(same_bits(dx1.rows(T, T), dx2.rows(T, T)));
  }
}

// ---- the per-head L2 norm and the output gate ----

namespace {

struct Heads {
  int64_t N, H, K;
};
// K = 1 runs the forwards only: there the backwards' projections cancel to
// eps / (x^2 + eps)^(3/2) of dy, which no fp32 computation keeps a bit of
// (nor needs to: the gradient is ~1e-6 dy).
const Heads kNorms[] = {{4, 3, 1}, {5, 3, 7}, {37, 4, 64}, {65, 2, 100}, {3, 1, 300}};
// Past K = 1536 fewer than 8 warps' dw rows fit in shared memory (3 at K =
// 4000); past K = 12288 none does and they go to global memory. 600 items:
// three blocks of 256.
const Heads kGates[] = {{4, 3, 1},   {5, 3, 7},    {37, 4, 64}, {300, 2, 100},
                        {3, 2, 4000}, {2, 1, 13000}};

}  // namespace

TEST_CASE("cuda kda l2 norm forward and backward match the CPU", "[gpu][kda]") {
  const double eps = 1e-6;
  for (DType dt : kDtypes)
    for (Heads s : kNorms)
      for (bool offset : {false, true}) {
        INFO(dtype_name(dt) << " N=" << s.N << " H=" << s.H << " K=" << s.K
                            << " offset=" << offset);
        const Shape shape{s.N, s.H * s.K};
        Pair x = random_pair(shape, dt, 31, offset, 1.5);
        Tensor y = poisoned_at(shape, dt, offset);
        kern::kda_l2norm_forward(y, x.dev, s.K, eps);
        Tensor y_ref = Tensor::empty(shape, DType::F64);
        kern::kda_l2norm_forward(y_ref, f64(x.host), s.K, eps);
        check_output(dt, y, y_ref);
        if (s.K == 1) continue;

        Pair dy = random_pair(shape, dt, 32, offset);
        const Tensor dx0 = random_start(shape, dt, 33);
        for (kern::Store store : kStores) {
          INFO("store=" << store_name(store));
          Tensor dx_ref = f64(dx0);
          kern::kda_l2norm_backward(dx_ref, f64(dy.host), f64(x.host), s.K, eps, store);
          Tensor dx[2];
          for (int rep = 0; rep < 2; ++rep) {
            dx[rep] = in_grad_start(dx0, dt, offset, store);
            kern::kda_l2norm_backward(dx[rep], dy.dev, x.dev, s.K, eps, store);
          }
          check_in_grad(dt, dx[0], dx_ref, dx0, store);
          REQUIRE(same_bits(dx[0], dx[1]));
        }
      }
}

TEST_CASE("cuda kda output gate forward and backward match the CPU and repeat bit for bit",
          "[gpu][kda]") {
  const double eps = 1e-5;
  for (DType dt : kDtypes)
    for (Heads s : kGates)
      for (bool offset : {false, true}) {
        INFO(dtype_name(dt) << " N=" << s.N << " H=" << s.H << " K=" << s.K
                            << " offset=" << offset);
        const Shape shape{s.N, s.H * s.K};
        Pair o = random_pair(shape, dt, 41, offset, 2.0);
        Pair w = random_pair({s.K}, dt, 42, offset);
        Pair z = random_pair(shape, dt, 43, offset, 1.5);
        Tensor y = poisoned_at(shape, dt, offset);
        kern::kda_out_gate_forward(y, o.dev, w.dev, z.dev, s.K, eps);
        Tensor y_ref = Tensor::empty(shape, DType::F64);
        kern::kda_out_gate_forward(y_ref, f64(o.host), f64(w.host), f64(z.host), s.K, eps);
        check_output(dt, y, y_ref);
        if (s.K == 1) continue;

        Pair dy = random_pair(shape, dt, 44, offset);
        const Tensor do0 = random_start(shape, dt, 45), dz0 = random_start(shape, dt, 46);
        const Tensor dw0 = random_start({s.K}, DType::F32, 47);
        for (kern::Store store : kStores) {
          INFO("store=" << store_name(store));
          Tensor do_ref = f64(do0), dz_ref = f64(dz0), dw_ref = f64(dw0);
          kern::kda_out_gate_backward(do_ref, dw_ref, dz_ref, f64(dy.host), f64(o.host),
                                      f64(w.host), f64(z.host), s.K, eps, store);
          Tensor d_o[2], dz[2], dw[2];
          for (int rep = 0; rep < 2; ++rep) {
            d_o[rep] = in_grad_start(do0, dt, offset, store);
            dz[rep] = in_grad_start(dz0, dt, offset, store);
            dw[rep] = param_start(dw0, offset);
            kern::kda_out_gate_backward(d_o[rep], dw[rep], dz[rep], dy.dev, o.dev, w.dev, z.dev,
                                        s.K, eps, store);
          }
          check_in_grad(dt, d_o[0], do_ref, do0, store);
          check_in_grad(dt, dz[0], dz_ref, dz0, store);
          check_param(dw[0], dw_ref);
          REQUIRE(same_bits(d_o[0], d_o[1]));
          REQUIRE(same_bits(dz[0], dz[1]));
          REQUIRE(same_bits(dw[0], dw[1]));
        }
      }
}

// ---- the decay and beta ----

TEST_CASE("cuda kda decay forward and backward match the CPU and repeat bit for bit",
          "[gpu][kda]") {
  // f ~ N(0, 12): about one u = f + dt_bias in ten lies past +-20, where
  // softplus is u itself (and sigmoid 1) or exp(u) (and sigmoid ~0); 150
  // channels take two column tiles, 130 rows three row blocks.
  const Heads kDecays[] = {{1, 1, 1}, {37, 3, 16}, {130, 2, 64}, {7, 5, 33}, {70, 3, 50}};
  int64_t linear = 0;  // elements on softplus's linear branch, over the case
  for (DType dt : kDtypes)
    for (Heads s : kDecays)
      for (bool offset : {false, true}) {
        INFO(dtype_name(dt) << " N=" << s.N << " H=" << s.H << " K=" << s.K
                            << " offset=" << offset);
        const int64_t HK = s.H * s.K;
        const Shape shape{s.N, HK};
        Pair f = random_pair(shape, dt, 51, offset, 12.0);
        Pair a_log = random_pair({s.H}, dt, 52, offset, 0.7);
        Pair dt_bias = random_pair({HK}, dt, 53, offset);
        for (int64_t i = 0; i < f.host.numel(); ++i)
          linear += testing::at(f.host, i) + testing::at(dt_bias.host, i % HK) > 20;

        Tensor g = poisoned_at(shape, dt, offset);
        kern::kda_decay_forward(g, f.dev, a_log.dev, dt_bias.dev, s.K);
        Tensor g_ref = Tensor::empty(shape, DType::F64);
        kern::kda_decay_forward(g_ref, f64(f.host), f64(a_log.host), f64(dt_bias.host), s.K);
        check_output(dt, g, g_ref);

        Pair dg = random_pair(shape, dt, 54, offset);
        const Tensor df0 = random_start(shape, dt, 55);
        const Tensor da0 = random_start({s.H}, DType::F32, 56);
        const Tensor ddt0 = random_start({HK}, DType::F32, 57);
        for (kern::Store store : kStores) {
          INFO("store=" << store_name(store));
          Tensor df_ref = f64(df0), da_ref = f64(da0), ddt_ref = f64(ddt0);
          kern::kda_decay_backward(df_ref, da_ref, ddt_ref, f64(dg.host), f64(f.host),
                                   f64(a_log.host), f64(dt_bias.host), s.K, store);
          Tensor df[2], da[2], ddt[2];
          for (int rep = 0; rep < 2; ++rep) {
            df[rep] = in_grad_start(df0, dt, offset, store);
            da[rep] = param_start(da0, offset);
            ddt[rep] = param_start(ddt0, offset);
            kern::kda_decay_backward(df[rep], da[rep], ddt[rep], dg.dev, f.dev, a_log.dev,
                                     dt_bias.dev, s.K, store);
          }
          check_in_grad(dt, df[0], df_ref, df0, store);
          check_param(da[0], da_ref);
          check_param(ddt[0], ddt_ref);
          REQUIRE(same_bits(df[0], df[1]));
          REQUIRE(same_bits(da[0], da[1]));
          REQUIRE(same_bits(ddt[0], ddt[1]));
        }
      }
  REQUIRE(linear > 100);
}

TEST_CASE("cuda kda beta forward and backward match the CPU", "[gpu][kda]") {
  // 7000 values: 16-byte packs and a tail where aligned, element by element
  // at an offset.
  struct Size {
    int64_t N, H;
  };
  for (DType dt : kDtypes)
    for (Size s : {Size{1, 1}, Size{37, 3}, Size{1000, 7}})
      for (bool offset : {false, true}) {
        INFO(dtype_name(dt) << " N=" << s.N << " H=" << s.H << " offset=" << offset);
        const Shape shape{s.N, s.H};
        Pair b = random_pair(shape, dt, 61, offset, 2.0);
        Tensor beta = poisoned_at(shape, dt, offset);
        kern::kda_beta_forward(beta, b.dev);
        Tensor beta_ref = Tensor::empty(shape, DType::F64);
        kern::kda_beta_forward(beta_ref, f64(b.host));
        check_output(dt, beta, beta_ref);

        // The backward reads the forward's beta: the device's, the same on both sides.
        const Tensor beta_h = f64(to_host_f32(beta));
        Pair dbeta = random_pair(shape, dt, 62, offset);
        const Tensor db0 = random_start(shape, dt, 63);
        for (kern::Store store : kStores) {
          INFO("store=" << store_name(store));
          Tensor db_ref = f64(db0);
          kern::kda_beta_backward(db_ref, f64(dbeta.host), beta_h, store);
          Tensor db = in_grad_start(db0, dt, offset, store);
          kern::kda_beta_backward(db, dbeta.dev, beta, store);
          check_in_grad(dt, db, db_ref, db0, store);
        }
      }
}
