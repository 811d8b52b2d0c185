#include "train/plan.h"

#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>
#include <memory>
#include <tuple>

#include "core/error.h"
#include "core/rng.h"
#include "model/flops.h"
#include "model/params.h"
#include "parallel/layout.h"
#include "parallel/runtime.h"
#include "parallel/schedule.h"
#include "train/memory.h"
#include "train/optimizer.h"

namespace attnres::train {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

// Bytes per second of one large memcpy: what a message between two MPI
// ranks of this machine costs (shared-memory transports copy it once or twice).
double copy_bandwidth() {
  const size_t n = size_t(64) << 20;
  std::vector<char> a(n, 1), b(n, 0);
  double best = 1e30;
  for (int i = 0; i < 5; ++i) {
    const auto t0 = Clock::now();
    std::memcpy(b.data(), a.data(), n);
    best = std::min(best, seconds_since(t0));
  }
  return static_cast<double>(n) / best;
}

// What chunk c holds, as the executor's RankModel builds it: its layers, the
// embedding (chunk 0), the final Mix, norm and LM head (the last chunk).
model::ModelParts chunk_parts(const parallel::PipelineLayout& pl, int c) {
  model::ModelParts parts;
  parts.layer_begin = pl.layers(c).begin;
  parts.layer_end = pl.layers(c).end;
  parts.embedding = c == 0;
  parts.head = c == pl.C() - 1;
  return parts;
}

// The chunk's parameters: those of every replica, and its routed experts'
// (all E; with expert parallelism a rank holds E / EP of them).
struct ChunkParams {
  double dense = 0, experts = 0;
};
ChunkParams chunk_params(const model::ModelConfig& m, const model::ModelParts& parts) {
  ChunkParams n;
  for (const auto& p : model::param_shapes(m, parts))
    (p.expert >= 0 ? n.experts : n.dense) += static_cast<double>(p.numel());
  return n;
}

// A ring all-reduce of `bytes` over n members: 2 (n-1)/n of the bytes each
// way, 2 (n-1) latencies.
double ring_sum(const parallel::LinkCost& link, int n, double bytes) {
  if (n <= 1 || bytes <= 0) return 0;
  return 2.0 * (n - 1) / n * bytes / link.bytes_per_sec + 2.0 * (n - 1) * link.latency;
}

// Values the AttnRes Mix reads per token over the chunk's sublayers, in units
// of d: every source (and the partial sum) it attends over, plus its output;
// DenseFormer's averages before the chunk's layers (but the first) likewise.
double chunk_mix_reads(const model::ModelConfig& m, const model::ModelParts& parts) {
  double n = 0;
  if (m.denseformer()) {
    for (int64_t l = std::max<int64_t>(1, parts.layer_begin); l < parts.layer_end; ++l)
      n += static_cast<double>(l + 1) + 1;
    return n;
  }
  if (!m.attnres()) return 0;
  for (int64_t s = 2 * parts.layer_begin; s < 2 * parts.layer_end; ++s)
    n += static_cast<double>(m.mix_sources(s)) + 1;
  return n;
}


// Bytes of one activation element: fp32 on the CPU, bf16 on GPUs.
double element_bytes(const HardwareProfile& hw) { return hw.measure_cpu ? 4.0 : 2.0; }

// Expert parallelism: each MoE layer's forward sends its routed rows to the
// expert group and gets their outputs back, and its backward does the same
// with the gradients: 4 all-to-alls per layer and microbatch, each member
// sending (EP-1)/EP of its N K [, d] rows (balanced routing) over NVLink when
// the group's EP P consecutive ranks share a node. A member waits for them
// inside its forward and backward: they add to the chunk's times. Seconds per
// pass (forward or backward) of the chunk's layers.
double exchange_seconds(const Config& cfg, const PlanLayout& L, const HardwareProfile& hw,
                        const model::ModelParts& parts) {
  if (L.EP <= 1) return 0;
  const auto& m = cfg.model;
  const double tokens = static_cast<double>(cfg.training.micro_batch_size * cfg.training.seq_len);
  const parallel::LinkCost link = L.EP * L.P <= hw.devices_per_node ? hw.intra_node : hw.inter_node;
  const double a2a = static_cast<double>(L.EP - 1) / L.EP * tokens *
                         static_cast<double>(m.moe.top_k) * static_cast<double>(m.d_model) *
                         element_bytes(hw) / link.bytes_per_sec +
                     (L.EP - 1) * link.latency;
  int moe_layers = 0;
  for (int64_t l = parts.layer_begin; l < parts.layer_end; ++l) moe_layers += m.moe_layer(l);
  return 2 * moe_layers * a2a;
}

// Forward seconds of a chunk's computation on one microbatch (the backward
// costs twice as much): its FLOPs at the profile's rate plus the AttnRes
// Mix's reads at its bandwidth. The cpu profile measures instead; for it
// (no peak rate) this is the FLOPs at a nominal 100 GFLOP/s, which only
// balanced_split reads, and only for their ratios.
double compute_seconds(const Config& cfg, const HardwareProfile& hw, const model::ModelParts& parts) {
  const auto& m = cfg.model;
  const double tokens = static_cast<double>(cfg.training.micro_batch_size * cfg.training.seq_len);
  const double flops = model::forward_flops_per_token(m, cfg.training.seq_len, parts) * tokens;
  const double rate = hw.peak_flops > 0 ? hw.peak_flops * hw.efficiency : 100e9;
  const double mix = hw.hbm_bytes_per_sec > 0
                         ? chunk_mix_reads(m, parts) * tokens * static_cast<double>(m.d_model) *
                               element_bytes(hw) / hw.hbm_bytes_per_sec
                         : 0;
  return flops / rate + mix;
}

}  // namespace

HardwareProfile hardware_profile(const std::string& name) {
  HardwareProfile h;
  h.name = name;
  if (name == "cpu") {
    h.measure_cpu = true;
    h.cores = static_cast<double>(std::max(1L, sysconf(_SC_NPROCESSORS_ONLN)));
    h.devices_per_node = 1 << 20;  // every rank on this machine
    h.intra_node = {10e-6, copy_bandwidth()};
    h.inter_node = h.intra_node;
    h.description = "this machine under MPI: " + std::to_string(int(h.cores)) +
                    " cores shared by the ranks, messages at memcpy bandwidth (" +
                    std::to_string(int(h.intra_node.bytes_per_sec / 1e9)) +
                    " GB/s, measured) + 10 us";
  } else if (name == "h100") {
    h.peak_flops = 989e12;       // H100 SXM dense BF16
    h.efficiency = 0.36;         // our 350M baseline, bf16 (docs/measurements/2026-11-22-h100-2)
    h.hbm_bytes_per_sec = 2.7e12;  // 80% of HBM3's 3.35 TB/s
    h.device_bytes = 80e9;
    h.devices_per_node = 8;
    h.intra_node = {10e-6, 450e9 * 0.8};  // NVLink 4: 450 GB/s per direction
    h.inter_node = {20e-6, 50e9 * 0.8};   // one 400 Gb/s InfiniBand NIC per GPU
    h.description =
        "H100 SXM: 989 TFLOP/s bf16 at 36% (our measured 350M baseline), HBM 2.7 TB/s, 80 GB; "
        "8 per node on NVLink 4 (360 GB/s + 10 us), nodes on 400 Gb/s InfiniBand "
        "(40 GB/s + 20 us)";
  } else {
    fail("unknown hardware profile '", name, "' (cpu or h100)");
  }
  return h;
}

std::string describe(const PlanLayout& l) {
  return "P" + std::to_string(l.P) + " V" + std::to_string(l.V) + " D" + std::to_string(l.D) +
         (l.EP > 1 ? " EP" + std::to_string(l.EP) : "") + (l.cache ? " cached" : " naive");
}

PlanLayout layout_of(const Config& cfg) {
  return {static_cast<int>(cfg.parallel.pipeline), static_cast<int>(cfg.parallel.virtual_stages),
          static_cast<int>(cfg.parallel.data), static_cast<int>(cfg.training.grad_accum),
          cfg.parallel.cache_blocks, static_cast<int>(cfg.parallel.expert),
          cfg.parallel.layers_per_chunk};
}

std::vector<int64_t> balanced_split(const Config& cfg, const PlanLayout& L,
                                    const HardwareProfile& hw) {
  const int64_t n = cfg.model.n_layers;
  const int C = L.P * L.V;
  ATTNRES_CHECK(C >= 1 && C <= n, "balanced_split: ", C, " chunks for ", n, " layers");
  // cost[b][e]: forward + backward seconds of a chunk holding layers [b, e),
  // with the embedding when b = 0 and the head when e = n.
  std::vector<std::vector<double>> cost(static_cast<size_t>(n + 1),
                                        std::vector<double>(static_cast<size_t>(n + 1), 0.0));
  for (int64_t b = 0; b < n; ++b)
    for (int64_t e = b + 1; e <= n; ++e) {
      model::ModelParts parts;
      parts.layer_begin = b, parts.layer_end = e;
      parts.embedding = b == 0, parts.head = e == n;
      cost[size_t(b)][size_t(e)] =
          3 * compute_seconds(cfg, hw, parts) + 2 * exchange_seconds(cfg, L, hw, parts);
    }
  // 1. The contiguous split whose costliest chunk is cheapest (dynamic
  //    programming over (chunks, layers)).
  const double inf = 1e300;
  std::vector<std::vector<double>> best(static_cast<size_t>(C + 1),
                                        std::vector<double>(static_cast<size_t>(n + 1), inf));
  std::vector<std::vector<int64_t>> cut(best.size(), std::vector<int64_t>(size_t(n + 1), 0));
  best[0][0] = 0;
  for (int c = 1; c <= C; ++c)
    for (int64_t e = c; e <= n - (C - c); ++e)
      for (int64_t b = c - 1; b < e; ++b) {
        const double v = std::max(best[size_t(c - 1)][size_t(b)], cost[size_t(b)][size_t(e)]);
        if (v < best[size_t(c)][size_t(e)]) best[size_t(c)][size_t(e)] = v, cut[size_t(c)][size_t(e)] = b;
      }
  std::vector<int64_t> bounds(static_cast<size_t>(C + 1), n);  // chunk c is [bounds[c], bounds[c+1])
  for (int c = C; c >= 1; --c) bounds[size_t(c - 1)] = cut[size_t(c)][size_t(bounds[size_t(c)])];
  // 2. A rank runs V chunks, so what sets its pace is their sum: move single
  //    boundaries by one layer while that lowers (the busiest rank's sum, the
  //    costliest chunk, the sum of squared chunk costs), in that order.
  auto score = [&](const std::vector<int64_t>& bd) {
    std::vector<double> rank(static_cast<size_t>(L.P), 0.0);
    double worst = 0, squares = 0;
    for (int c = 0; c < C; ++c) {
      const double x = cost[size_t(bd[size_t(c)])][size_t(bd[size_t(c + 1)])];
      rank[size_t(c % L.P)] += x, worst = std::max(worst, x), squares += x * x;
    }
    return std::make_tuple(*std::max_element(rank.begin(), rank.end()), worst, squares);
  };
  for (auto now = score(bounds);;) {
    auto best_move = now;
    std::vector<int64_t> best_bounds;
    for (int c = 1; c < C; ++c)
      for (int64_t step : {-1, 1}) {
        std::vector<int64_t> bd = bounds;
        bd[size_t(c)] += step;
        if (bd[size_t(c)] <= bd[size_t(c - 1)] || bd[size_t(c)] >= bd[size_t(c + 1)]) continue;
        const auto s = score(bd);
        if (s < best_move) best_move = s, best_bounds = bd;
      }
    if (best_bounds.empty()) break;
    bounds = best_bounds, now = best_move;
  }
  std::vector<int64_t> split;
  for (int c = 0; c < C; ++c) split.push_back(bounds[size_t(c + 1)] - bounds[size_t(c)]);
  return split;
}

int threads_per_rank(const HardwareProfile& hw, const PlanLayout& l) {
  return std::max(1, static_cast<int>(hw.cores) / l.gpus());
}

ChunkTimes measure_chunk_times(const Config& cfg, int chunks, int threads, int steps,
                               const std::vector<int64_t>& split) {
  const int saved_threads = omp_get_max_threads();
  omp_set_num_threads(threads);
  const int64_t B = cfg.training.micro_batch_size, T = cfg.training.seq_len;
  const int M = static_cast<int>(cfg.training.grad_accum);
  parallel::Comm solo = parallel::Comm::solo();
  parallel::ProcessGrid grid(solo, 1, 1);
  parallel::RuntimeOptions ro;
  ro.V = chunks;  // one process runs every chunk, messages to itself
  ro.layers_per_chunk = split;
  ro.cache_blocks = cfg.parallel.cache_blocks;
  ro.recompute = cfg.training.recompute;
  parallel::Runtime rt(grid, cfg.model, DType::F32, Device::CPU, ro, B, T);
  auto& rm = rt.model();
  std::vector<std::unique_ptr<Optimizer>> opts;
  for (int v = 0; v < rm.size(); ++v) {
    rm.chunk(v).params().init(cfg.training.seed);
    opts.push_back(std::make_unique<Optimizer>(rm.chunk(v).params(), cfg.optimizer));
  }
  auto random_ids = [&](uint64_t stream) {
    Tensor t = Tensor::empty({B * T}, DType::I32);
    for (int64_t i = 0; i < B * T; ++i)
      t.data<int32_t>()[i] = static_cast<int32_t>(random_u64(7, stream, i) % cfg.model.vocab_size);
    return t;
  };
  std::vector<data::TokenLoader::Batch> batches;
  for (int mb = 0; mb < M; ++mb) batches.push_back({random_ids(2 * mb), random_ids(2 * mb + 1)});

  const auto C = static_cast<size_t>(chunks);
  std::vector<std::vector<double>> fwd(C), bwd(C), upd(C);
  rt.executor().set_trace(true);
  for (int s = 0; s <= steps; ++s) {  // step 0 warms up
    const auto st = rt.train_step(M, [&](int mb) { return batches[static_cast<size_t>(mb)]; },
                                  1.0 / static_cast<double>(M * B * T));
    const double norm = rt.grad_norm();
    std::vector<double> f(C, 0), b(C, 0), u(C, 0);
    for (const auto& ct : st.trace)
      (ct.action.op == parallel::Op::Forward ? f : b)[static_cast<size_t>(ct.action.chunk)] +=
          (ct.end - ct.start) / M;
    for (int v = 0; v < rm.size(); ++v) {
      const auto t0 = Clock::now();
      opts[static_cast<size_t>(v)]->step(1e-4, norm);
      u[static_cast<size_t>(rm.chunk_id(v))] = seconds_since(t0);
    }
    if (s == 0) continue;
    for (size_t c = 0; c < C; ++c) {
      fwd[c].push_back(f[c]);
      bwd[c].push_back(b[c]);
      upd[c].push_back(u[c]);
    }
  }
  rt.executor().set_trace(false);
  omp_set_num_threads(saved_threads);
  ChunkTimes out;
  for (size_t c = 0; c < C; ++c) {
    out.fwd.push_back(median(fwd[c]));
    out.bwd.push_back(median(bwd[c]));
    out.update.push_back(median(upd[c]));
  }
  return out;
}

Prediction predict(const Config& cfg, const PlanLayout& L, const HardwareProfile& hw,
                   const ChunkTimes* measured) {
  const auto& m = cfg.model;
  const int64_t B = cfg.training.micro_batch_size, T = cfg.training.seq_len;
  const double tokens = static_cast<double>(B * T);
  const double d = static_cast<double>(m.d_model);
  const double elem = element_bytes(hw);
  const parallel::PipelineLayout pl(m.n_layers, L.P, L.V, L.split);
  const auto plan = parallel::DepthPlan::of(m);
  const parallel::ScheduleSpec spec{L.P, L.V, L.M};
  const int C = spec.C();
  auto costs = parallel::StepCosts::uniform(spec, 0, 0);

  std::vector<ChunkParams> params(static_cast<size_t>(C));
  std::vector<double> exchange(static_cast<size_t>(C), 0.0);  // all-to-all seconds per pass
  for (int c = 0; c < C; ++c) {
    const model::ModelParts parts = chunk_parts(pl, c);
    const auto i = static_cast<size_t>(c);
    params[i] = chunk_params(m, parts);
    exchange[i] = exchange_seconds(cfg, L, hw, parts);
    costs.fwd[i] = costs.bwd[i] = exchange[i];
    if (c > 0)
      costs.msg_bytes[i] =
          static_cast<double>(parallel::boundary_message(pl, plan, c, L.cache).tensors()) * tokens *
          d * elem;
    if (hw.measure_cpu) continue;
    const double compute = compute_seconds(cfg, hw, parts);
    costs.fwd[i] += compute;
    costs.bwd[i] += 2 * compute;
  }
  if (hw.measure_cpu) {
    ATTNRES_CHECK(measured && static_cast<int>(measured->fwd.size()) == C,
                  "predict: the cpu profile needs chunk times measured for ", C, " chunks");
    for (size_t i = 0; i < static_cast<size_t>(C); ++i) {
      costs.fwd[i] += measured->fwd[i];
      costs.bwd[i] += measured->bwd[i];
    }
    costs.cores = hw.cores;
    costs.threads = threads_per_rank(hw, L);
  }
  auto node = [&](int stage) { return stage / hw.devices_per_node; };  // replica 0
  costs.link = [&](int a, int b) { return node(a) == node(b) ? hw.intra_node : hw.inter_node; };
  // Data-parallel sums: a ring over the D replicas, on NVLink when all
  // replicas share a node; a rank's E / EP experts' over the D / EP
  // replicas holding them.
  const parallel::LinkCost ring = L.gpus() <= hw.devices_per_node ? hw.intra_node : hw.inter_node;
  for (int c = 0; c < C; ++c) {
    const auto i = static_cast<size_t>(c);
    const double experts = params[i].experts / L.EP;  // held by this rank
    costs.grad_sum[i] = ring_sum(ring, L.D, params[i].dense * 4) +
                        ring_sum(ring, L.D / L.EP, experts * 4);
    const int r = c % L.P;
    // AdamW: fp32 weight, gradient and moments read, weight and moments
    // written, bf16 copy written: 30 bytes per parameter on a GPU.
    costs.update[static_cast<size_t>(r)] +=
        hw.measure_cpu ? measured->update[i]
                       : (params[i].dense + experts) * 30 / hw.hbm_bytes_per_sec;
  }
  if (m.tie_embeddings && C > 1)  // the embedding gradient goes both ways between first and last
    for (int r : {0, (C - 1) % L.P})
      costs.update[static_cast<size_t>(r)] +=
          costs.link(0, (C - 1) % L.P).time(static_cast<double>(m.vocab_size) * d * 4);

  const auto lists = parallel::pipeline_schedule(spec);
  const auto comm = hw.measure_cpu ? parallel::CommModel::Mpi : parallel::CommModel::Nccl;
  Prediction p;
  p.layout = L;
  p.sim = parallel::simulate(spec, lists, comm, costs);
  ATTNRES_CHECK(!p.sim.deadlock, "predict ", describe(L), ": ", p.sim.detail);
  auto free_costs = costs;
  free_costs.link = nullptr;
  for (auto& g : free_costs.grad_sum) g = 0;
  for (size_t i = 0; i < exchange.size(); ++i) {
    free_costs.fwd[i] -= exchange[i];
    free_costs.bwd[i] -= exchange[i];
  }
  p.exposed_comm = p.sim.step_time - parallel::simulate(spec, lists, comm, free_costs).step_time;
  p.step_time = p.sim.step_time;
  const double step_tokens = tokens * L.M * L.D;
  p.tokens_per_sec = step_tokens / p.step_time;
  if (hw.peak_flops > 0)
    p.mfu = p.tokens_per_sec * model::training_flops_per_token(m, T) / (hw.peak_flops * L.gpus());
  // Memory per rank (train/memory.h): this layout, in bf16 on GPUs.
  Config at = cfg;
  at.parallel.pipeline = L.P;
  at.parallel.virtual_stages = L.V;
  at.parallel.data = L.D;
  at.parallel.expert = L.EP;
  at.parallel.cache_blocks = L.cache;
  at.parallel.layers_per_chunk = L.split;
  at.training.grad_accum = L.M;
  at.training.precision = hw.measure_cpu ? DType::F32 : DType::BF16;
  for (const RankMemory& r : plan_memory(at))
    p.bytes_per_rank = std::max(p.bytes_per_rank, static_cast<double>(r.total()));
  p.fits = hw.device_bytes <= 0 || p.bytes_per_rank <= 0.9 * hw.device_bytes;
  return p;
}

std::vector<PlanLayout> candidate_layouts(const Config& cfg, int gpus) {
  ATTNRES_CHECK(gpus >= 1, "--gpus must be >= 1");
  const int64_t G = cfg.training.grad_accum * cfg.parallel.data;  // global microbatches
  std::vector<PlanLayout> out;
  for (int P = 1; P <= gpus; ++P) {
    if (gpus % P != 0 || P > cfg.model.n_layers) continue;
    const int D = gpus / P, EP = static_cast<int>(cfg.parallel.expert);
    if (G % D != 0 || D % EP != 0) continue;
    const int M = static_cast<int>(G / D);
    for (int V : {1, 2, 4}) {
      if (P * V > cfg.model.n_layers || (V > 1 && (P == 1 || M % P != 0))) continue;
      for (bool cache : {false, true}) {
        if (!cache && (!cfg.model.depth_sources() || P == 1)) continue;
        out.push_back({P, V, D, M, cache, EP, {}});  // an even split
      }
    }
  }
  return out;
}

}  // namespace attnres::train
