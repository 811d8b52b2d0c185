// The timed pipeline simulator: hand-computed timelines (messages, processor
// sharing, gradient sums and update), and the property the executor's NCCL
// ordering is built for: with a stream per link, rendezvous costs nothing
// over MPI's non-blocking sends, so the bubble is (P-1)/(V*M) with free
// messages and only the transfers on the critical path with timed ones.
#include <catch2/catch.hpp>

#include "parallel/schedule.h"
#include "parallel/simulator.h"

using namespace attnres::parallel;

namespace {

StepCosts with_messages(const ScheduleSpec& s, double msg_time) {
  StepCosts c = StepCosts::uniform(s);  // t_f 1, t_b 2
  for (auto& b : c.msg_bytes) b = 1000;
  c.link = [msg_time](int, int) { return LinkCost{msg_time, 0}; };
  return c;
}

}  // namespace

TEST_CASE("NCCL with a stream per link: the bubble is (P-1)/(VM), and rendezvous costs nothing",
          "[simulator]") {
  int checked = 0;
  for (int P : {2, 4, 8})
    for (int V : {1, 2, 4})
      for (int M : {2 * P, 4 * P}) {
        const ScheduleSpec s{P, V, M};
        const auto lists = pipeline_schedule(s);
        const double formula = double(P - 1) / (V * M);
        INFO("P=" << P << " V=" << V << " M=" << M);
        const SimResult free = simulate(s, lists, CommModel::Nccl);
        REQUIRE_FALSE(free.deadlock);
        CHECK(std::abs(free.bubble - formula) <= 0.1 * formula);
        // Messages that take time: every receive is already waiting when its
        // message leaves, so NCCL's rendezvous adds nothing to MPI's eager
        // sends; what remains over the formula is transfer time on the
        // critical path.
        for (double msg : {0.05, 0.2, 0.5}) {
          INFO("message time " << msg << " t_f");
          const StepCosts c = with_messages(s, msg);
          const SimResult mpi = simulate(s, lists, CommModel::Mpi, c);
          const SimResult nccl = simulate(s, lists, CommModel::Nccl, c);
          REQUIRE_FALSE(nccl.deadlock);
          CHECK(nccl.makespan == Approx(mpi.makespan).epsilon(1e-12));
          CHECK(nccl.bubble >= formula - 1e-12);
          ++checked;
        }
      }
  CHECK(checked == 54);
  // The same lists with every rank's groups on one stream: an early receive
  // holds up the rank's later sends (here until nothing can move).
  const ScheduleSpec s{8, 2, 32};
  CHECK(simulate(s, pipeline_schedule(s), CommModel::NcclOneStream).deadlock);
}

TEST_CASE("a message adds its latency on both crossings of a two-stage pipeline", "[simulator]") {
  const ScheduleSpec s{2, 1, 1};
  const auto lists = pipeline_schedule(s);
  for (CommModel m : {CommModel::Mpi, CommModel::Nccl}) {
    const SimResult r = simulate(s, lists, m, with_messages(s, 0.25));
    // F0 (1) -> act (0.25) -> F1 (1), B1 (2) -> grad (0.25) -> B0 (2)
    CHECK(r.makespan == Approx(6.5));
    CHECK(r.ideal == Approx(3.0));
    CHECK(r.busy[0] == Approx(3.0));
    CHECK(r.end[1] == Approx(4.25));
  }
  // Bandwidth: latency + bytes / rate.
  StepCosts c = StepCosts::uniform(s);
  c.msg_bytes = {0, 2e6};
  c.link = [](int, int) { return LinkCost{1e-3, 1e6}; };  // 1 ms + 2 s
  CHECK(simulate(s, lists, CommModel::Mpi, c).makespan == Approx(6.0 + 2 * 2.001));
}

TEST_CASE("ranks sharing cores slow each other down (processor sharing)", "[simulator]") {
  // P=2, M=2, one core for both ranks. rank 0: F0.0 | F0.1 B0.0 | B0.1,
  // rank 1: F1.0 B1.0 F1.1 B1.1 (t_f 1, t_b 2). Timeline:
  //  0-1 F0.0 alone; 1-3 F0.1 and F1.0 at half speed; 3-5 B1.0 alone;
  //  5-7 B0.0 (half done) and F1.1; 7-9 B0.0's rest and half of B1.1;
  //  9-10 B1.1's rest alone; 10-12 B0.1 alone.
  const ScheduleSpec s{2, 1, 2};
  StepCosts c = StepCosts::uniform(s);
  c.cores = 1;
  const SimResult r = simulate(s, pipeline_schedule(s), CommModel::Mpi, c);
  CHECK(r.makespan == Approx(12.0));
  CHECK(r.end[1] == Approx(10.0));
  CHECK(r.busy[0] == Approx(1 + 2 + 4 + 2));  // wall time computing, slowed down
  // Two cores: no sharing, the plain 1F1B timeline (ideal 6, bubble (P-1)/M).
  c.cores = 2;
  CHECK(simulate(s, pipeline_schedule(s), CommModel::Mpi, c).makespan == Approx(9.0));
}

TEST_CASE("gradient sums start at a chunk's last backward, and the update follows them",
          "[simulator]") {
  // P = 1, V = 2: both chunks on one rank (messages to itself).
  // F0 0-1, F1 1-2, B1 2-4, B0 4-6. Chunk 1's sum runs 4-14, chunk 0's 14-15.
  const ScheduleSpec s{1, 2, 1};
  StepCosts c = StepCosts::uniform(s);
  c.grad_sum = {1.0, 10.0};
  c.update = {0.5};
  const SimResult r = simulate(s, pipeline_schedule(s), CommModel::Nccl, c);
  CHECK(r.makespan == Approx(6.0));
  CHECK(r.step_time == Approx(15.5));
  c.grad_sum = {1.0, 1.0};  // hidden behind B0 but chunk 0's own
  CHECK(simulate(s, pipeline_schedule(s), CommModel::Nccl, c).step_time == Approx(7.5));
}

TEST_CASE("costs sized for another layout are refused", "[simulator]") {
  const ScheduleSpec s{2, 2, 4};
  StepCosts c = StepCosts::uniform(ScheduleSpec{2, 1, 4});
  CHECK_THROWS_WITH(simulate(s, pipeline_schedule(s), CommModel::Mpi, c),
                    Catch::Contains("costs sized for another layout"));
}
