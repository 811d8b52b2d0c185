// train::largest_fitting, the search behind `inspect memory --gpu-memory` and
// `bench --batch auto`: the largest value that fits, for thresholds anywhere,
// and never a question past the caller's bound.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>

#include "parallel/layout.h"
#include "train/config.h"
#include "train/memory.h"

using attnres::train::largest_fitting;

TEST_CASE("largest_fitting finds the largest value that fits, for every threshold", "[memory]") {
  for (int64_t lo : {1, 4}) {
    for (int64_t step : {1, 3}) {
      for (int64_t limit = lo - step; limit < lo + 200; ++limit) {
        int64_t asked_max = 0;
        const int64_t got = largest_fitting(lo, step, [&](int64_t v) {
          asked_max = std::max(asked_max, v);
          return v <= limit;
        });
        // The largest lo + k step <= limit; lo - step when lo itself does not fit.
        const int64_t want = limit < lo ? lo - step : lo + (limit - lo) / step * step;
        INFO("lo " << lo << ", step " << step << ", fits up to " << limit);
        CHECK(got == want);
        // Doubling asks at most about twice the answer.
        CHECK(asked_max <= std::max(lo + step, 2 * want + step));
      }
    }
  }
}

TEST_CASE("largest_fitting stops at its bound and asks nothing beyond it", "[memory]") {
  for (int64_t hi : {1, 2, 5, 64, 100}) {
    for (int64_t limit : {hi - 1, hi, hi + 1, int64_t{1} << 40}) {
      int64_t asked_max = 0;
      const int64_t got = largest_fitting(1, 1, [&](int64_t v) {
        asked_max = std::max(asked_max, v);
        return v <= limit;
      }, hi);
      INFO("bound " << hi << ", fits up to " << limit);
      CHECK(got == std::min(limit, hi));
      CHECK(asked_max <= hi);
    }
  }
  // A bound off the grid: the last grid value below it.
  CHECK(largest_fitting(2, 5, [](int64_t) { return true; }, 20) == 17);
  CHECK(largest_fitting(2, 5, [](int64_t v) { return v <= 13; }, 20) == 12);
}

TEST_CASE("the planner counts cuDNN's attention workspace where it may run", "[memory]") {
  // A bf16 cuda run whose peak is an attention backward (d_ff small): with
  // training.attention_kernel auto the plan holds cuDNN's fp32 row sums
  // [N, H] and dQ accumulator [N, H hd] on top, at most that much more.
  attnres::train::Config c;
  c.model.vocab_size = 64, c.model.d_model = 128, c.model.n_layers = 2, c.model.n_heads = 4;
  c.model.n_kv_heads = 4, c.model.d_ff = 32;
  c.training.micro_batch_size = 2, c.training.seq_len = 64;
  c.training.device = attnres::Device::CUDA, c.training.precision = attnres::DType::BF16;
  const int64_t N = 2 * 64, ws = N * 4 * 4 + N * 128 * 4;
  const int64_t own = attnres::train::plan_memory(c).at(0).activations;
  c.training.attention_kernel = attnres::kernels::AttentionKernel::Auto;
  const int64_t with = attnres::train::plan_memory(c).at(0).activations;
  CHECK(with > own);
  CHECK(with - own <= ws);
  c.training.device = attnres::Device::CPU, c.training.precision = attnres::DType::F32;
  const int64_t cpu_auto = attnres::train::plan_memory(c).at(0).activations;
  c.training.attention_kernel = attnres::kernels::AttentionKernel::Own;
  CHECK(attnres::train::plan_memory(c).at(0).activations == cpu_auto);  // the CPU runs its own
}

TEST_CASE("the planner holds a CUDA graph's sent messages to the step's end", "[memory]") {
  // Eagerly a packed message is released once its send completed; a rank's
  // step as a CUDA graph completes its sends at the end (parallel/step_graph.h).
  // P = 2, four microbatches in flight under 1F1B: more held, by at most what
  // the step sends.
  attnres::train::Config c;
  c.model.vocab_size = 64, c.model.d_model = 64, c.model.n_layers = 4, c.model.n_heads = 2;
  c.model.n_kv_heads = 2, c.model.d_ff = 96, c.model.mode = attnres::model::ResidualMode::Block;
  c.model.block_size = 2;
  c.training.micro_batch_size = 2, c.training.seq_len = 32, c.training.grad_accum = 4;
  c.training.device = attnres::Device::CUDA, c.training.precision = attnres::DType::BF16;
  c.parallel.pipeline = 2;
  const auto eager = attnres::train::plan_memory(c);
  c.training.cuda_graphs = attnres::train::CudaGraphs::On;
  const auto graphed = attnres::train::plan_memory(c);
  const attnres::parallel::PipelineLayout layout(4, 2, 1);
  const int64_t step_bytes = attnres::parallel::pipeline_bytes_per_step(
      layout, attnres::parallel::DepthPlan::of(c.model), true, 4, 1, 2 * 32, 64, 2);
  REQUIRE(eager.size() == 2);
  for (size_t p = 0; p < 2; ++p) {
    INFO("stage " << p << ": eager " << eager[p].activations << " bytes, graphed "
                  << graphed[p].activations << ", the step sends " << step_bytes);
    CHECK(graphed[p].activations > eager[p].activations);
    CHECK(graphed[p].activations - eager[p].activations <= step_bytes);
    CHECK(graphed[p].resident() == eager[p].resident());
  }
}
