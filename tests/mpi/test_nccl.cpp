// The NCCL transport on one GPU (run with `mpirun -np 1 tests/test_mpi "[nccl]"`
// on a GPU machine; skipped with a message elsewhere). NCCL < 2.30 refuses two
// ranks on one GPU, so one process exercises it: a message to itself (handed
// over by the transport's base class: NCCL's point-to-point needs two ranks
// per link), the tied-embedding exchange with itself, the data-parallel
// all-reduce and ZeRO-1's reduce-scatter and all-gather (real NCCL calls on
// one-rank communicators), and a pipeline of two chunks on one rank (P = 1,
// V = 2), with and without ZeRO-1; the same through the MPI transport staging
// device tensors through host memory. What one GPU cannot run: the per-link
// point-to-point path, and NcclRequest::test across ranks (docs/cuda.md; the
// gpu-multi tests on 2+ GPUs). And CUDA graphs (training.cuda_graphs): those
// calls captured and replayed, and the pipeline of two chunks as a graph gives
// the eager step's bits.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>

#include "core/device.h"
#include "core/rng.h"
#include "core/worst.h"
#include "model/model.h"
#include "mpi_testing.h"
#include "parallel/nccl_transport.h"
#include "parallel/runtime.h"
#include "testing.h"
#include "train/stepper.h"

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

// Elements of `dev` (any device and dtype) that differ from `want`; a NaN counts.
int64_t wrong_elements(const Tensor& dev, const Tensor& want) {
  const Tensor got = dev.to(Device::CPU).to(DType::F32), w = want.to(DType::F32);
  int64_t wrong = 0;
  for (int64_t i = 0; i < w.numel(); ++i) wrong += !(got.data<float>()[i] == w.data<float>()[i]);
  return wrong;
}

// The NCCL transport of a one-rank job (its own communicators).
struct SelfTransport {
  parallel::Comm self = group_of(1);
  parallel::ProcessGrid grid{self, 1, 1};
  std::unique_ptr<parallel::Transport> tr = parallel::make_nccl_transport(grid);
};

}  // namespace

TEST_CASE("NCCL transport on one rank: a message to itself, byte counters, collectives", "[.nccl]") {
  if (!have_gpu_and_nccl()) return;
  INFO("NCCL " << parallel::nccl_version() << ", " << cuda::device_description());
  SelfTransport one;
  auto& tr = one.tr;
  const int64_t n = 1 << 20;  // 4 MiB: beyond NCCL's default FIFO, so a real rendezvous
  Tensor sent = host_iota(n, 0.5f).to(Device::CUDA);
  Tensor got = Tensor::zeros({n}, DType::F32, Device::CUDA);
  parallel::Request r = tr->irecv(got, 0);  // posted first, as the executor does
  parallel::Request s = tr->isend(sent, 0);
  r.wait();
  s.wait();
  CHECK(wrong_elements(got, host_iota(n, 0.5f)) == 0);
  CHECK(tr->traffic().sent[0] == n * 4);
  CHECK(tr->traffic().received[0] == n * 4);
  // sum_with_peer with itself doubles (ncclSend/ncclRecv in a group on the
  // pipeline communicator).
  Tensor t = host_iota(1000, 1.0f).to(Device::CUDA);
  tr->sum_with_peer(t, 0);
  CHECK(t.to(Device::CPU).data<float>()[999] == 2000.0f);
}

// The data-parallel collectives with D = 1 are real NCCL calls on a one-rank
// communicator (ncclAllReduce, ncclReduceScatter, ncclAllGather), so one GPU
// runs the same calls as D > 1, on the communication stream, ordered against
// the compute stream by events; every element is checked.
TEST_CASE("NCCL transport on one rank: data-parallel sum, ZeRO-1 reduce-scatter and all-gather",
          "[.nccl]") {
  if (!have_gpu_and_nccl()) return;
  SelfTransport one;
  auto& tr = one.tr;
  // The all-reduce over one replica is the identity, on tensors of several
  // sizes in one group (as a chunk's gradients are).
  const Tensor a = host_iota(3001, 0.25f), b = host_iota(7, -1.5f);
  std::vector<Tensor> grads = {a.to(Device::CUDA), b.to(Device::CUDA)};
  auto pending = tr->start_sum_across_replicas(grads);
  pending->finish();
  CHECK(wrong_elements(grads[0], a) == 0);
  CHECK(wrong_elements(grads[1], b) == 0);
  // Reduce-scatter: this replica's slice of the flat space is all of it.
  const int64_t n = 4099;
  const Tensor flat = host_iota(n, 0.75f);
  Tensor mine = Tensor::empty({n}, DType::F32, Device::CUDA);
  cuda::fill_u32(mine.raw(), 0x7fc00000u, static_cast<size_t>(n));  // NaN until written
  tr->start_reduce_scatter(flat.to(Device::CUDA), mine)->finish();
  CHECK(wrong_elements(mine, flat) == 0);
  // All-gather, F32 (weights) and BF16 (a bf16 run's ZeRO-1 weights).
  for (DType dt : {DType::F32, DType::BF16}) {
    const Tensor part = host_iota(n, 0.5f).to(dt);
    Tensor whole = Tensor::empty({n}, dt, Device::CUDA);
    cuda::fill_u32(whole.raw(), 0x7fc07fc0u, whole.nbytes() / 4);
    tr->all_gather(part.to(Device::CUDA), whole);
    INFO(dtype_name(dt));
    CHECK(wrong_elements(whole, part) == 0);
  }
}

// The expert all-to-all (Transport::all_to_all: grouped ncclSend / ncclRecv
// on the expert communicator) through a one-member expert group, so the same
// NCCL calls as EP > 1 run on one GPU: a self-send of every row, in F32 and
// BF16 (the model's dtypes of the exchanged rows), and an empty exchange.
TEST_CASE("NCCL transport on one rank: the expert all-to-all as a self-send", "[.nccl]") {
  if (!have_gpu_and_nccl()) return;
  SelfTransport one;
  auto& tr = one.tr;
  const int64_t rows = 37, c = 24;
  for (DType dt : {DType::F32, DType::BF16}) {
    INFO(dtype_name(dt));
    const Tensor want = host_iota(rows * c, 0.25f).reshape({rows, c}).to(dt);
    Tensor got = Tensor::empty({rows, c}, dt, Device::CUDA);
    cuda::fill_u32(got.raw(), 0x7fc07fc0u, got.nbytes() / 4);  // NaN until written
    tr->all_to_all(want.to(Device::CUDA), {rows}, got, {rows});
    CHECK(wrong_elements(got, want) == 0);
  }
  Tensor none = Tensor::empty({0, c}, DType::F32, Device::CUDA);
  tr->all_to_all(none, {0}, none, {0});  // no rows: nothing sent, nothing waits
  cuda::synchronize();
}

// The exchange between two ranks (EP = 2) where NCCL lets them share one GPU
// (ranks with a GPU each always can): rank r sends q rows to rank q ... of
// values naming (sender, receiver, row, column), each rank checks what it
// got. Run by `gpu: nccl expert all-to-all (2 ranks)`; skipped, with NCCL's
// refusal, where the two ranks share a GPU and NCCL does not allow it.
TEST_CASE("NCCL expert all-to-all between two ranks", "[.nccl2]") {
  if (!have_gpu_and_nccl()) return;
  REQUIRE(world().size() == 2);
  const int r = world().rank();
  cuda::select_device(r % cuda::device_count());
  parallel::ProcessGrid grid(world(), 1, 2, 2);
  std::unique_ptr<parallel::Transport> tr;
  std::string why;
  try {
    tr = parallel::make_nccl_transport(grid);
  } catch (const std::exception& e) {
    why = e.what();
  }
  double refused = why.empty() ? 0 : 1;
  world().allreduce_max(&refused, 1);
  if (refused > 0) {
    INFO(why);
    REQUIRE(cuda::device_count() < 2);  // a GPU each: NCCL must take it
    WARN("skipped: NCCL refused two ranks on one GPU (NCCL " << parallel::nccl_version()
                                                              << "): " << why);
    return;
  }
  const int64_t c = 8;
  auto rows = [](int from, int to) { return int64_t{3} + 2 * from + 5 * to; };  // 3, 8, 5, 10
  auto value = [&](int from, int to, int64_t row, int64_t col) {
    return float(1000 * from + 100 * to + 10 * row + col);
  };
  // The blocks (from, to) of `pairs`, one after the other.
  auto blocks = [&](std::vector<std::pair<int, int>> pairs) {
    int64_t n = 0;
    for (auto [from, to] : pairs) n += rows(from, to);
    Tensor t = Tensor::empty({n, c}, DType::F32);
    float* at = t.data<float>();
    for (auto [from, to] : pairs)
      for (int64_t i = 0; i < rows(from, to); ++i)
        for (int64_t j = 0; j < c; ++j) *at++ = value(from, to, i, j);
    return t;
  };
  const Tensor send = blocks({{r, 0}, {r, 1}});
  const Tensor want = blocks({{0, r}, {1, r}});
  Tensor got = Tensor::empty(want.shape(), DType::F32, Device::CUDA);
  cuda::fill_u32(got.raw(), 0x7fc00000u, static_cast<size_t>(got.numel()));
  tr->all_to_all(send.to(Device::CUDA), {rows(r, 0), rows(r, 1)}, got, {rows(0, r), rows(1, r)});
  CHECK(wrong_elements(got, want) == 0);
}

// What a rank's step as a CUDA graph holds of the transport (parallel/step_graph.h):
// ncclSend / ncclRecv in a group (the tied-embedding exchange, here with
// itself) and the data-parallel collectives on the communication stream,
// forked from the captured compute stream and joined back into it by the
// transport's events. Captured once and launched three times: each launch
// does the work again on the buffers' current values (and the capture alone
// runs nothing).
TEST_CASE("NCCL transport on one rank: its exchange and sums in a CUDA graph, replayed",
          "[.nccl]") {
  if (!have_gpu_and_nccl()) return;
  SelfTransport one;
  auto& tr = one.tr;
  const int64_t n = 1000;
  Tensor t = host_iota(n, 1.0f).to(Device::CUDA);
  const Tensor g0 = host_iota(n, -0.5f);
  Tensor g = g0.to(Device::CUDA), flat = Tensor::empty({n}, DType::F32, Device::CUDA);
  Tensor mine = Tensor::empty({n}, DType::F32, Device::CUDA);
  cuda::StreamGraph graph;
  graph.capture([&] {
    tr->sum_with_peer(t, 0);                          // t + t
    tr->start_sum_across_replicas({g})->finish();     // one replica: g stays
    tr->start_reduce_scatter(flat, mine)->finish();   // one replica: mine = flat
  });
  CHECK(t.to(Device::CPU).data<float>()[n - 1] == float(n));  // nothing ran yet
  for (int k = 1; k <= 3; ++k) {
    INFO("launch " << k);
    const Tensor want = host_iota(n, 0.75f * float(k));
    flat.copy_from(want);
    cuda::fill_u32(mine.raw(), 0x7fc00000u, static_cast<size_t>(n));  // NaN until written
    graph.launch();
    CHECK(wrong_elements(t, host_iota(n, float(1 << k))) == 0);  // doubled k times
    CHECK(wrong_elements(mine, want) == 0);
    CHECK(wrong_elements(g, g0) == 0);
  }
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
  struct Variant {
    parallel::TransportKind transport;
    bool zero;
    const char* name;
  };
  const Variant variants[] = {{parallel::TransportKind::Nccl, false, "nccl"},
                              {parallel::TransportKind::Nccl, true, "nccl, zero = 1"},
                              {parallel::TransportKind::Mpi, false, "mpi"}};
  for (const auto& [transport, zero, name] : variants) {
    parallel::Comm self = group_of(1);
    parallel::ProcessGrid grid(self, 1, 1);
    parallel::RuntimeOptions ro;
    ro.V = 2;  // two chunks on this rank: messages to itself
    ro.transport = transport;
    ro.zero = zero;  // the step's gradients through ncclReduceScatter
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
      worst = nan_max(worst, std::sqrt(diff / std::max(norm, 1e-30)));
    }
    INFO(name << ": largest relative gradient difference to the CPU " << worst);
    CHECK(worst <= 1e-3);
    if (zero) {
      // ZeRO-1's all-gather of the (not updated) weights gives them back bit for bit.
      std::vector<Tensor> before;
      for (model::Param* p : rt.model().params()) before.push_back(p->weights().clone());
      rt.gather_updated_weights();
      size_t i = 0;
      for (model::Param* p : rt.model().params())
        CHECK(testing::same_bits(p->weights(), before[i++]));
    }
  }
}

// training.cuda_graphs beyond a single chunk: a rank's step with its
// transport's operations captured (parallel/step_graph.h). On one GPU that is
// two chunks on one rank: messages to itself, the tied embedding's local sum,
// and with ZeRO-1 ncclReduceScatter on a one-rank communicator inside the
// graph. Five AdamW steps on new tokens each: the losses, gradients and
// weights of the eager steps, bit for bit. (A pipeline of several GPUs, its
// ncclSend / ncclRecv captured: tests/gpu/pipeline_cuda.sh under gpu-multi.)
TEST_CASE("two chunks over NCCL replayed as a CUDA graph give the eager step's bits", "[.nccl]") {
  if (!have_gpu_and_nccl()) return;
  train::Config c;
  c.model.vocab_size = 97, c.model.d_model = 64, c.model.n_layers = 4, c.model.n_heads = 2;
  c.model.n_kv_heads = 1, c.model.d_ff = 96, c.model.mode = model::ResidualMode::Block;
  c.model.block_size = 3, c.model.tie_embeddings = true;
  const int64_t B = 2, T = 32, A = 3;
  c.training.micro_batch_size = B, c.training.seq_len = T, c.training.grad_accum = A;
  c.training.device = Device::CUDA;
  c.training.attention_kernel = kernels::AttentionKernel::Own;
  for (const bool zero : {false, true})
    for (DType dt : {DType::F32, DType::BF16}) {
      c.training.precision = dt;
      INFO((zero ? "zero = 1, " : "") << dtype_name(dt));
      parallel::Comm self = group_of(1);
      parallel::ProcessGrid grid(self, 1, 1);
      auto run = [&](bool graphs, std::vector<double>& losses) {
        parallel::RuntimeOptions ro;
        ro.V = 2, ro.transport = parallel::TransportKind::Nccl, ro.zero = zero;
        ro.cuda_graphs = graphs;
        auto st = std::make_unique<train::Stepper>(grid, c, ro);
        st->init_weights(7);
        for (int k = 0; k < 5; ++k) {
          const auto data = [&](int mb) {
            data::TokenLoader::Batch b;
            b.inputs = Tensor::empty({B * T}, DType::I32);
            b.targets = Tensor::empty({B * T}, DType::I32);
            for (int64_t i = 0; i < B * T; ++i) {
              b.inputs.data<int32_t>()[i] = int32_t(random_u64(11, 10 * k + mb, i) % 97);
              b.targets.data<int32_t>()[i] = int32_t(random_u64(12, 10 * k + mb, i) % 97);
            }
            return b;
          };
          losses.push_back(st->forward_backward(int(A), data, 1.0 / double(A * B * T)).loss_sum);
          st->update(3e-3, st->grad_norm());
        }
        return st;
      };
      std::vector<double> a, b;
      auto eager = run(false, a);
      auto graphed = run(true, b);
      CHECK(graphed->runtime().graph_launches() == 4);  // step 1 eager, 2 captured, 3-5 replays
      REQUIRE(a.size() == b.size());
      for (size_t k = 0; k < a.size(); ++k) {
        INFO("step " << k + 1 << ": " << a[k] << " vs " << b[k]);
        CHECK(std::isfinite(b[k]));
        CHECK(std::memcmp(&a[k], &b[k], sizeof(double)) == 0);
      }
      const auto pa = eager->runtime().model().params(), pb = graphed->runtime().model().params();
      REQUIRE(pa.size() == pb.size());
      for (size_t i = 0; i < pa.size(); ++i) {
        INFO(pa[i]->name);
        CHECK(same_bits(pa[i]->weights(), pb[i]->weights()));
        CHECK(same_bits(pa[i]->grad, pb[i]->grad));
      }
    }
}
