// MLA on CUDA against the CPU (run in double on the same values): attention
// whose values have a width of their own (kernels/cuda/attention_values.cu:
// forward, backward with Store::Set and Add, decoding; with GQA groups too),
// and the MLA expansion (kernels/cuda/mla.cu: copies, RoPE on the dr dims,
// k_r's gradient summed over the heads), in F32 and BF16.
#include <catch2/catch.hpp>

#include "gpu_testing.h"
#include "kernels/attention.h"
#include "kernels/mla.h"

using namespace attnres;
using namespace attnres::gpu_testing;
namespace kern = attnres::kernels;

namespace {
Tensor f64(const Tensor& host_f32) { return host_f32.to(DType::F64); }
}  // namespace

TEST_CASE("cuda attention with values of their own width matches the CPU", "[gpu][mla]") {
  // {B, T, H, Hkv, hd, vd}: MLA's (H = Hkv, hd = dn + dr > vd), a GQA group
  // with wider values, and a long row.
  const kern::AttnShape shapes[] = {{2, 37, 4, 4, 24, 16}, {1, 19, 4, 2, 8, 20}, {1, 300, 2, 2, 40, 32}};
  for (DType dt : {DType::F32, DType::BF16})
    for (const kern::AttnShape& s : shapes) {
      INFO(dtype_name(dt) << " B=" << s.B << " T=" << s.T << " H=" << s.H << " Hkv=" << s.Hkv
                          << " hd=" << s.hd << " vd=" << s.vd);
      const int64_t N = s.B * s.T, W = kern::qkv_width(s);
      Tensor hq = randn_f32({N, W}, 3 + s.T);
      Tensor qkv = to_device(hq, dt);
      Tensor out = poisoned({N, s.H * s.dv()}, dt);
      Tensor lse = poisoned({s.B, s.H, s.T}, DType::F32);
      kern::attention_forward(out, lse, qkv, s, kern::AttentionKernel::Auto);
      Tensor out_ref = Tensor::empty({N, s.H * s.dv()}, DType::F64);
      Tensor lse_ref = Tensor::empty({s.B, s.H, s.T}, DType::F64);
      kern::attention_forward(out_ref, lse_ref, f64(hq), s);
      REQUIRE(rel_l2(to_host_f32(out), out_ref) < tol(dt));
      REQUIRE(rel_l2(to_host_f32(lse), lse_ref) < 1e-5);

      // Backward from the reference's own out and lse (rounded as the device's
      // are), written into a poisoned dqkv and added onto a random one.
      Pair dout = random_pair({N, s.H * s.dv()}, dt, 7, false);
      for (kern::Store store : {kern::Store::Set, kern::Store::Add}) {
        INFO((store == kern::Store::Set ? "Set" : "Add"));
        Pair d0 = random_pair({N, W}, dt, 9, false);
        Tensor dqkv = store == kern::Store::Set ? poisoned({N, W}, dt) : d0.dev;
        kern::attention_backward(dqkv, dout.dev, qkv, out, lse, s, store, kern::AttentionKernel::Auto);
        Tensor ref = store == kern::Store::Set ? Tensor::zeros({N, W}, DType::F64) : f64(d0.host);
        kern::attention_backward(ref, f64(dout.host), f64(hq), out_ref, lse_ref, s, kern::Store::Add);
        REQUIRE(rel_l2(to_host_f32(dqkv), ref) < tol(dt) * 2);
      }

      // Decoding: the last position of each sequence against caches of every row.
      const int64_t Tmax = s.T + 3;
      Tensor hqd = randn_f32({s.B, s.H * s.hd}, 17), hk = randn_f32({s.B, Tmax, s.Hkv * s.hd}, 18),
             hv = randn_f32({s.B, Tmax, s.Hkv * s.dv()}, 19);
      Tensor qd = to_device(hqd, dt), kc = to_device(hk, dt), vc = to_device(hv, dt);
      Tensor od = poisoned({s.B, s.H * s.dv()}, dt);
      kern::attention_decode(od, qd, kc, vc, s.T, s);
      Tensor od_ref = Tensor::empty({s.B, s.H * s.dv()}, DType::F64);
      kern::attention_decode(od_ref, f64(hqd), f64(hk), f64(hv), s.T, s);
      REQUIRE(rel_l2(to_host_f32(od), od_ref) < tol(dt));
    }
}

TEST_CASE("cuda MLA expansion and its backward match the CPU", "[gpu][mla]") {
  for (DType dt : {DType::F32, DType::BF16})
    for (double theta : {0.0, 10000.0})  // NoPE, RoPE on the dr dims
      for (int64_t pos0 : {int64_t(0), int64_t(5)}) {
        const kern::MlaShape s{2, 13, 3, 6, 4, 5};
        INFO(dtype_name(dt) << " theta=" << theta << " pos0=" << pos0);
        const int64_t N = s.B * s.T, W = kern::qkv_width(s.attn());
        Tensor hq = randn_f32({N, s.H * s.dqk()}, 1), hkv = randn_f32({N, s.H * (s.dn + s.dv)}, 2),
               hkr = randn_f32({N, s.dr}, 3);
        Tensor q = to_device(hq, dt), kv = to_device(hkv, dt), kr = to_device(hkr, dt);
        Tensor qkv = poisoned({N, W}, dt);
        kern::mla_expand_forward(qkv, q, kv, kr, s, theta, pos0);
        Tensor ref = Tensor::empty({N, W}, DType::F64);
        kern::mla_expand_forward(ref, f64(hq), f64(hkv), f64(hkr), s, theta, pos0);
        // Copies are exact; rotated dims carry fp32 (or bf16) rounding.
        REQUIRE(rel_l2(to_host_f32(qkv), ref) < (dt == DType::BF16 ? tol(dt) : 1e-6));

        Pair g = random_pair({N, W}, dt, 4, false);
        Tensor dq = poisoned({N, s.H * s.dqk()}, dt), dkv = poisoned({N, s.H * (s.dn + s.dv)}, dt),
               dkr = poisoned({N, s.dr}, dt);
        kern::mla_expand_backward(dq, dkv, dkr, g.dev, s, theta, pos0);
        Tensor rq = Tensor::empty({N, s.H * s.dqk()}, DType::F64),
               rkv = Tensor::empty({N, s.H * (s.dn + s.dv)}, DType::F64),
               rkr = Tensor::empty({N, s.dr}, DType::F64);
        kern::mla_expand_backward(rq, rkv, rkr, f64(g.host), s, theta, pos0);
        CHECK(rel_l2(to_host_f32(dq), rq) < (dt == DType::BF16 ? tol(dt) : 1e-6));
        CHECK(rel_l2(to_host_f32(dkv), rkv) < (dt == DType::BF16 ? tol(dt) : 1e-6));
        CHECK(rel_l2(to_host_f32(dkr), rkr) < (dt == DType::BF16 ? tol(dt) : 1e-5));
      }
}
