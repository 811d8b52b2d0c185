// The pipeline schedule: the golden interleaved order of docs/parallel.md, the
// invariants (validator), deadlock freedom and the bubble (simulator) over a
// grid with P = 2, odd P and V up to 4, and that the validator catches broken lists.
#include <catch2/catch.hpp>

#include <algorithm>

#include "core/error.h"
#include "parallel/schedule.h"
#include "parallel/simulator.h"

using namespace attnres;
using namespace attnres::parallel;

namespace {

std::vector<Action> computes(const std::vector<Action>& list) {
  std::vector<Action> out;
  for (const auto& a : list)
    if (a.is_compute()) out.push_back(a);
  return out;
}

}  // namespace

TEST_CASE("golden interleaved order P=4 V=2 M=8 (docs/parallel.md)", "[schedule]") {
  const ScheduleSpec s{4, 2, 8};
  const auto rank0 = parse_actions(
      "F0.0-F0.3 F4.0-F4.3 F0.4 F0.5 | F0.6 B4.0 F0.7 B4.1 F4.4 B4.2 F4.5 B4.3 F4.6 B0.0 F4.7 "
      "B0.1 | B0.2 B0.3 B4.4-B4.7 B0.4-B0.7");
  // The spec elides the middle of rank 3's steady state with "..."; written out:
  const auto rank3 = parse_actions(
      "F3.0-F3.3 | F7.0 B7.0 F7.1 B7.1 F7.2 B7.2 F7.3 B7.3 F3.4 B3.0 F3.5 B3.1 F3.6 B3.2 F3.7 "
      "B3.3 F7.4 B7.4 F7.5 B7.5 F7.6 B7.6 F7.7 B7.7 | B3.4-B3.7");
  CHECK(to_text(compute_order(s, 0)) == to_text(rank0));
  CHECK(to_text(compute_order(s, 3)) == to_text(rank3));
  CHECK(warmup_forwards(s, 0) == 10);
  CHECK(warmup_forwards(s, 3) == 4);
  // The full lists carry the same computes in the same order.
  auto lists = pipeline_schedule(s);
  CHECK(to_text(computes(lists[0])) == to_text(rank0));
  CHECK(to_text(computes(lists[3])) == to_text(rank3));
  // Text dump with the phase separators of the spec.
  const std::string dump = dump_schedule(s);
  CHECK(dump.find("rank0: F0.0 F0.1 F0.2 F0.3 F4.0 F4.1 F4.2 F4.3 F0.4 F0.5 | F0.6 B4.0") !=
        std::string::npos);
  CHECK(dump.find("F4.7 B0.1 | B0.2 B0.3 B4.4") != std::string::npos);
  CHECK(dump.find("rank3: F3.0 F3.1 F3.2 F3.3 | F7.0 B7.0") != std::string::npos);
}

TEST_CASE("1F1B order (V = 1)", "[schedule]") {
  const ScheduleSpec s{4, 1, 6};
  CHECK(to_text(compute_order(s, 0)) ==
        to_text(parse_actions("F0.0-F0.2 | F0.3 B0.0 F0.4 B0.1 F0.5 B0.2 | B0.3-B0.5")));
  CHECK(to_text(compute_order(s, 3)) ==
        to_text(parse_actions("F3.0 B3.0 F3.1 B3.1 F3.2 B3.2 F3.3 B3.3 F3.4 B3.4 F3.5 B3.5")));
  // Fewer microbatches than stages: warm-up is capped at M.
  CHECK(to_text(compute_order({4, 1, 2}, 0)) == to_text(parse_actions("F0.0 F0.1 B0.0 B0.1")));
}

TEST_CASE("every schedule of the grid is valid, deadlock-free, with bubble (P-1)/(V*M)",
          "[schedule]") {
  int checked = 0;
  for (int P : {1, 2, 3, 4, 5, 8})
    for (int V : {1, 2, 3, 4})
      for (int M : {1, 2, 3, 4, 5, 6, 8, 12, 16, 24}) {
        if (V > 1 && M % P != 0) continue;  // a configuration error (tested below)
        const ScheduleSpec s{P, V, M};
        INFO("P=" << P << " V=" << V << " M=" << M);
        const auto lists = pipeline_schedule(s);
        REQUIRE_NOTHROW(validate_schedule(s, lists));
        for (int r = 0; r < P; ++r) CHECK(lists[r] == rank_schedule(s, r));
        const SimResult a = simulate(s, lists, CommModel::Mpi);
        REQUIRE_FALSE(a.deadlock);
        CHECK(a.bubble == Approx(double(P - 1) / (V * M)).margin(1e-12));
        // Every rank did all its work: M*V forwards (t_f 1) and backwards (t_b 2).
        for (int r = 0; r < P; ++r) CHECK(a.busy[r] == Approx(3.0 * M * V));
        // The same lists under NCCL's rendezvous semantics: no deadlock, and
        // with a stream per link and free messages, no stall either.
        const SimResult g = simulate(s, lists, CommModel::Nccl);
        INFO(g.detail);
        REQUIRE_FALSE(g.deadlock);
        CHECK(g.makespan == Approx(a.makespan).margin(1e-12));
        ++checked;
      }
  CHECK(checked > 100);
}

TEST_CASE("forward-only schedules (evaluation) are valid and deadlock-free", "[schedule]") {
  for (int P : {1, 2, 3, 4})
    for (int V : {1, 2, 3})
      for (int M : {1, 3, 4}) {
        const ScheduleSpec s{P, V, M, true};
        INFO("P=" << P << " V=" << V << " M=" << M);
        const auto lists = pipeline_schedule(s);
        REQUIRE_NOTHROW(validate_schedule(s, lists));
        for (CommModel m : {CommModel::Mpi, CommModel::Nccl})
          CHECK_FALSE(simulate(s, lists, m).deadlock);
        for (const auto& list : lists)
          for (const auto& a : list) CHECK(a.op != Op::Backward);
      }
}

TEST_CASE("interleaving needs M divisible by P", "[schedule]") {
  try {
    compute_order({4, 2, 6}, 0);
    FAIL("expected an error");
  } catch (const Error& e) {
    CHECK(std::string(e.what()).find("training.grad_accum") != std::string::npos);
    CHECK(std::string(e.what()).find("parallel.pipeline") != std::string::npos);
  }
  CHECK_THROWS_AS(compute_order({0, 1, 4}, 0), Error);
}

TEST_CASE("P = 2: one peer, activations and gradients share its FIFO in the same order",
          "[schedule]") {
  const ScheduleSpec s{2, 2, 4};
  const auto lists = pipeline_schedule(s);
  // Both directions mix act and grad messages: the sequence of rank 0's sends
  // equals the sequence of rank 1's receives from rank 0, and vice versa.
  for (int a = 0; a < 2; ++a) {
    const int b = 1 - a;
    std::vector<std::string> sent, received;
    for (const auto& x : lists[a])
      if (x.is_send())
        sent.push_back((x.op == Op::SendAct ? "act " : "grad ") + std::to_string(x.chunk) + "." +
                       std::to_string(x.mb));
    for (const auto& x : lists[b])
      if (x.is_recv())
        received.push_back(x.op == Op::RecvAct
                               ? "act " + std::to_string(x.chunk - 1) + "." + std::to_string(x.mb)
                               : "grad " + std::to_string(x.chunk + 1) + "." +
                                     std::to_string(x.mb));
    CHECK(sent == received);
    bool mixed_act = false, mixed_grad = false;
    for (const auto& m : sent) (m[0] == 'a' ? mixed_act : mixed_grad) = true;
    CHECK((mixed_act && mixed_grad));
  }
}

TEST_CASE("the validator rejects broken lists", "[schedule]") {
  const ScheduleSpec s{2, 2, 4};
  const auto good = pipeline_schedule(s);
  auto expect_error = [&](std::vector<std::vector<Action>> lists, const std::string& needle) {
    try {
      validate_schedule(s, lists);
      FAIL("no error, expected '" << needle << "'");
    } catch (const InternalError& e) {  // a broken schedule is our fault, not the user's
      INFO(e.what());
      CHECK(std::string(e.what()).find(needle) != std::string::npos);
    }
  };
  {  // a receive posted before the previous one from the same peer (still
     // before its consumer): the FIFO no longer matches the sender's order
    auto lists = good;
    std::vector<size_t> recvs;
    for (size_t i = 0; i < lists[1].size(); ++i)
      if (lists[1][i].is_recv()) recvs.push_back(i);
    const Action moved = lists[1][recvs[2]];
    lists[1].erase(lists[1].begin() + static_cast<long>(recvs[2]));
    lists[1].insert(lists[1].begin() + static_cast<long>(recvs[1]), moved);
    expect_error(lists, "per-peer order");
  }
  {  // a send dropped
    auto lists = good;
    for (size_t i = 0; i < lists[0].size(); ++i)
      if (lists[0][i].is_send()) {
        lists[0].erase(lists[0].begin() + static_cast<long>(i));
        break;
      }
    expect_error(lists, "not sent right after it");
    // The message lists the rank's actions with the failing one marked.
    try {
      validate_schedule(s, lists);
    } catch (const InternalError& e) {
      const std::string what = e.what();
      INFO(what);
      CHECK(what.find("rank 0's action list:") != std::string::npos);
      CHECK(what.find("\n  >> ") != std::string::npos);
    }
  }
  {  // a backward moved before its forward
    auto lists = good;
    std::vector<Action> comp;
    for (auto& a : lists[1])
      if (a.is_compute()) comp.push_back(a);
    for (size_t i = 0; i < lists[1].size(); ++i)
      if (lists[1][i].op == Op::Backward) {
        Action b = lists[1][i];
        lists[1].erase(lists[1].begin() + static_cast<long>(i));
        lists[1].insert(lists[1].begin(), b);
        break;
      }
    expect_error(lists, "backward before its forward");
  }
  {  // a receive posted after the compute that needs it
    auto lists = good;
    auto& L = lists[1];
    const auto recv = std::find_if(L.begin(), L.end(), [](const Action& a) { return a.op == Op::RecvAct; });
    const Action moved = *recv;
    L.erase(recv);
    const auto fwd = std::find_if(L.begin(), L.end(), [&](const Action& a) {
      return a.op == Op::Forward && a.chunk == moved.chunk && a.mb == moved.mb;
    });
    L.insert(fwd + 2, moved);  // after the forward and its send
    expect_error(lists, "no receive was posted before it");
  }
  {  // a chunk on the wrong rank
    auto lists = good;
    for (auto& a : lists[0])
      if (a.op == Op::Forward) {
        a.chunk = 1;
        break;
      }
    expect_error(lists, "does not live on rank");
  }
}

TEST_CASE("the simulator detects a deadlock", "[schedule]") {
  // Rank 0 runs B0.0 before F0.0: it waits for a gradient that needs rank 1's
  // forward, which needs rank 0's forward, which comes after the backward.
  const ScheduleSpec s{2, 1, 1};
  std::vector<std::vector<Action>> lists(2);
  lists[0] = {
      {Op::RecvGrad, 0, 0, 1}, {Op::Backward, 0, 0}, {Op::Forward, 0, 0}, {Op::SendAct, 0, 0, 1}};
  lists[1] = {
      {Op::RecvAct, 1, 0, 0}, {Op::Forward, 1, 0}, {Op::Backward, 1, 0}, {Op::SendGrad, 1, 0, 0}};
  for (CommModel m : {CommModel::Mpi, CommModel::Nccl, CommModel::NcclOneStream}) {
    const SimResult res = simulate(s, lists, m);
    CHECK(res.deadlock);
    CHECK(res.detail.find("rank 0 stuck before B0.0") != std::string::npos);
    CHECK(res.detail.find("rank 1 stuck before F1.0") != std::string::npos);
  }
  // The generated list for the same spec runs.
  CHECK_FALSE(simulate(s, pipeline_schedule(s)).deadlock);
}

TEST_CASE("action lists round-trip through their text form", "[schedule]") {
  for (const ScheduleSpec& s : {ScheduleSpec{2, 2, 4}, ScheduleSpec{4, 2, 8}, ScheduleSpec{3, 1, 5}})
    for (const auto& list : pipeline_schedule(s)) {
      const std::string text = to_text(list);
      INFO(text);
      CHECK(parse_actions(text) == list);
    }
  CHECK(to_text(parse_actions("F0.0-F0.2 | B1.3")) == "F0.0 F0.1 F0.2 B1.3");
  CHECK_THROWS_WITH(parse_actions("F0.0 X1.2"), Catch::Contains("unknown action 'X1.2'"));
  CHECK_THROWS_WITH(parse_actions("F0.3-F0.1"), Catch::Contains("one chunk"));
  CHECK_THROWS_WITH(parse_actions("send act 1.0 <- r1"), Catch::Contains("malformed"));
  CHECK_THROWS_WITH(parse_actions("F1.x"), Catch::Contains("chunk.microbatch"));
}
