// The NCCL transport on one GPU (run with `mpirun -np 1 tests/test_mpi "[nccl]"`
// on a GPU machine; skipped with a message elsewhere). NCCL < 2.30 refuses two
// ranks on one GPU, so one process exercises it: a message to itself (handed
// over by the transport's base class: NCCL's point-to-point needs two ranks
// per link), the tied-embedding exchange with itself and the data-parallel
// sum (NCCL collectives), and a pipeline of two chunks on one rank (P = 1,
// V = 2); the same through the MPI transport staging device tensors through
// host memory. The per-link point-to-point path needs two GPUs (gpu-multi).
#include <catch2/catch.hpp>
#include <cmath>

#include "core/device.h"
#include "core/rng.h"
#include "model/model.h"
#include "mpi_testing.h"
#include "parallel/nccl_transport.h"
#include "parallel/runtime.h"

using namespace attnres;
using namespace attnres::testing;

namespace {

bool have_gpu_and_nccl() {
  if (!parallel::nccl_compiled()) {
    WARN("skipped: this build has no NCCL transport (needs CUDA + NCCL + MPI)");
    return false;
  }
  if (cuda::device_count() == 0) {
    WARN("skipped: no CUDA device visible");
    return false;
  }
  return true;
}

Tensor host_iota(int64_t n, float scale) {
  Tensor t = Tensor::empty({n}, DType::F32);
  for (int64_t i = 0; i < n; ++i) t.data<float>()[i] = scale * float(i + 1);
  return t;
}

}  // namespace

TEST_CASE("NCCL transport on one rank: a message to itself, byte counters, collectives", "[.nccl]") {
  if (!have_gpu_and_nccl()) return;
  INFO("NCCL " << parallel::nccl_version() << ", " << cuda::device_description(0));
  parallel::Comm self = group_of(1);
  parallel::ProcessGrid grid(self, 1, 1);
  auto tr = parallel::make_nccl_transport(grid);
  const int64_t n = 1 << 20;  // 4 MiB: beyond NCCL's default FIFO, so a real rendezvous
  Tensor sent = host_iota(n, 0.5f).to(Device::CUDA);
  Tensor got = Tensor::zeros({n}, DType::F32, Device::CUDA);
  parallel::Request r = tr->irecv(got, 0);  // posted first, as the executor does
  parallel::Request s = tr->isend(sent, 0);
  r.wait();
  s.wait();
  Tensor back = got.to(Device::CPU);
  int64_t wrong = 0;
  for (int64_t i = 0; i < n; ++i) wrong += back.data<float>()[i] != 0.5f * float(i + 1);
  CHECK(wrong == 0);
  CHECK(tr->traffic().sent[0] == n * 4);
  CHECK(tr->traffic().received[0] == n * 4);
  // sum_with_peer with itself doubles; a data-parallel sum over one replica is the identity.
  Tensor t = host_iota(1000, 1.0f).to(Device::CUDA);
  tr->sum_with_peer(t, 0);
  std::vector<Tensor> one = {t};
  tr->sum_across_replicas(one);
  Tensor h = t.to(Device::CPU);
  CHECK(h.data<float>()[999] == 2000.0f);
}

TEST_CASE("pipeline chunks on one GPU through NCCL and through staged MPI", "[.nccl]") {
  if (!have_gpu_and_nccl()) return;
  model::ModelConfig cfg;
  cfg.vocab_size = 37, cfg.d_model = 32, cfg.n_layers = 4, cfg.n_heads = 2, cfg.n_kv_heads = 1;
  cfg.d_ff = 48, cfg.mode = model::ResidualMode::Block, cfg.block_size = 3;
  const int64_t B = 2, T = 16, M = 3;
  auto unit = [&](int64_t u) {
    data::TokenLoader::Batch b;
    b.inputs = Tensor::empty({B * T}, DType::I32);
    b.targets = Tensor::empty({B * T}, DType::I32);
    for (int64_t i = 0; i < B * T; ++i) {
      b.inputs.data<int32_t>()[i] = int32_t(random_u64(4, u, i) % 37);
      b.targets.data<int32_t>()[i] = int32_t(random_u64(4, u, i + 1) % 37);
    }
    return b;
  };
  // CPU reference.
  model::Model ref(cfg);
  ref.params().init(9);
  double want = 0;
  const double scale = 1.0 / double(M * B * T);
  for (int64_t u = 0; u < M; ++u) {
    auto b = unit(u);
    want += ref.forward_backward(b.inputs, b.targets, B, T, scale);
  }
  const std::pair<parallel::TransportKind, const char*> transports[] = {
      {parallel::TransportKind::Nccl, "nccl"}, {parallel::TransportKind::Mpi, "mpi"}};
  for (const auto& [transport, name] : transports) {
    parallel::Comm self = group_of(1);
    parallel::ProcessGrid grid(self, 1, 1);
    parallel::RuntimeOptions ro;
    ro.V = 2;  // two chunks on this rank: messages to itself
    ro.transport = transport;
    parallel::Runtime rt(grid, cfg, DType::F32, Device::CUDA, ro, B, T);
    for (int v = 0; v < 2; ++v) rt.model().chunk(v).params().init(9);
    auto st = rt.train_step(
        int(M), [&](int mb) { return unit(mb); }, scale);
    INFO(name << ": loss " << st.loss_sum << " vs CPU " << want << ", pipeline bytes "
              << st.pp_bytes);
    CHECK(std::fabs(st.loss_sum - want) <= 1e-4 * std::fabs(want));
    CHECK(st.pp_bytes == parallel::pipeline_bytes_per_step(rt.layout(),
                                                           parallel::DepthPlan::of(cfg), true, M, 1,
                                                           B * T, cfg.d_model, 4));
    double worst = 0;
    for (model::Param* p : rt.model().params()) {
      Tensor g = p->grad.to(Device::CPU);
      const Tensor& r = ref.params().get(p->name).grad;
      double diff = 0, norm = 0;
      for (int64_t i = 0; i < g.numel(); ++i) {
        const double a = g.data<float>()[i], b = r.data<float>()[i];
        diff += (a - b) * (a - b);
        norm += b * b;
      }
      worst = std::max(worst, std::sqrt(diff / std::max(norm, 1e-30)));
    }
    INFO(name << ": largest relative gradient difference to the CPU " << worst);
    CHECK(worst <= 1e-3);
  }
}
