#include "parallel/simulator.h"

#include <algorithm>
#include <limits>
#include <map>
#include <sstream>
#include <tuple>

#include "core/error.h"

namespace attnres::parallel {

const char* comm_model_name(CommModel m) {
  switch (m) {
    case CommModel::Mpi:
      return "MPI non-blocking";
    case CommModel::Nccl:
      return "NCCL, a stream per link";
    case CommModel::NcclOneStream:
      return "NCCL, one stream per rank";
  }
  return "?";
}

StepCosts StepCosts::uniform(const ScheduleSpec& spec, double t_f, double t_b) {
  StepCosts c;
  c.fwd.assign(static_cast<size_t>(spec.C()), t_f);
  c.bwd.assign(static_cast<size_t>(spec.C()), t_b);
  c.msg_bytes.assign(static_cast<size_t>(spec.C()), 0.0);
  c.grad_sum.assign(static_cast<size_t>(spec.C()), 0.0);
  c.update.assign(static_cast<size_t>(spec.P), 0.0);
  return c;
}

namespace {

constexpr double kUnknown = -1;  // a time not determined yet

// One send or receive of a list.
struct CommOp {
  bool send = false;
  int partner = -1;  // the matching op on the other rank
  int group = -1;
  double msg_time = 0;
  double done = kUnknown;  // send: the message has left / arrived; receive: usable
};

// Operations issued together that complete together (an NCCL group), queued
// on a stream behind the previous group of the same stream (prev).
struct Group {
  std::vector<int> ops;
  int prev = -1, next = -1;
  double post = kUnknown;   // when the rank issued it
  double start = kUnknown;  // when its stream began it
  double done = kUnknown;
};

class Simulation {
 public:
  Simulation(const ScheduleSpec& s, const std::vector<std::vector<Action>>& lists, CommModel model,
             const StepCosts& costs)
      : s_(s), lists_(lists), model_(model), costs_(costs) {
    build();
  }
  SimResult run();

 private:
  void build();
  void post(int r, size_t i, double now);
  void settle();
  void visit(int g);
  void try_op(int o);
  double duration(const Action& a) const {
    const auto c = static_cast<size_t>(a.chunk);
    return a.op == Op::Forward ? costs_.fwd[c] : costs_.bwd[c];
  }

  const ScheduleSpec& s_;
  const std::vector<std::vector<Action>>& lists_;
  CommModel model_;
  const StepCosts& costs_;
  std::vector<CommOp> ops_;
  std::vector<Group> groups_;
  std::vector<std::vector<int>> op_at_;    // [rank][list index] -> op, or -1
  std::vector<std::vector<int>> recv_of_;  // [rank][list index of a compute] -> op it waits for
  std::vector<int> work_;                  // groups to look at again
};

void Simulation::build() {
  const int P = s_.P;
  ATTNRES_CHECK(static_cast<int>(lists_.size()) == P, "simulate: ", lists_.size(),
                " action lists for P = ", P);
  const auto C = static_cast<size_t>(s_.C());
  ATTNRES_CHECK(costs_.fwd.size() == C && costs_.bwd.size() == C && costs_.msg_bytes.size() == C &&
                    costs_.grad_sum.size() == C && costs_.update.size() == static_cast<size_t>(P),
                "simulate: costs sized for another layout (", costs_.fwd.size(), " chunks, ",
                costs_.update.size(), " ranks; expected ", C, " and ", P, ")");
  op_at_.resize(P);
  recv_of_.resize(P);
  // Streams: a key -> its last group. -1 in the key's first field = no stream.
  std::map<std::tuple<int, int, int>, int> stream_tail;
  std::map<std::pair<int, int>, std::vector<int>> sends, recvs;  // (from, to) -> ops in order
  for (int r = 0; r < P; ++r) {
    const auto& L = lists_[r];
    op_at_[r].assign(L.size(), -1);
    recv_of_[r].assign(L.size(), -1);
    std::map<std::tuple<Op, int, int>, int> recv_for;  // (consumer op, chunk, mb) -> op
    int open_group = -1;  // NcclOneStream: the group of the current run of comm actions
    for (size_t i = 0; i < L.size(); ++i) {
      const Action& a = L[i];
      if (a.is_compute()) {
        open_group = -1;
        auto it = recv_for.find({a.op, a.chunk, a.mb});
        if (it != recv_for.end()) recv_of_[r][i] = it->second;
        continue;
      }
      const int o = static_cast<int>(ops_.size());
      CommOp op;
      op.send = a.is_send();
      // Message size: into chunk c for activations, back from c+1 for gradients.
      const int into = a.op == Op::RecvGrad || a.op == Op::SendAct ? a.chunk + 1 : a.chunk;
      const int from = op.send ? r : a.peer, to = op.send ? a.peer : r;
      const LinkCost link = costs_.link ? costs_.link(from, to) : LinkCost{};
      op.msg_time = link.time(costs_.msg_bytes[static_cast<size_t>(into)]);
      // Its group and stream.
      std::tuple<int, int, int> key{-1, 0, 0};
      if (model_ == CommModel::NcclOneStream) key = {r, -1, 0};
      else if (model_ == CommModel::Nccl || op.send) key = {r, a.peer, op.send};
      int g = open_group;
      if (g < 0 || model_ != CommModel::NcclOneStream) {
        g = static_cast<int>(groups_.size());
        groups_.emplace_back();
        if (std::get<0>(key) >= 0) {
          auto it = stream_tail.find(key);
          if (it != stream_tail.end()) {
            groups_[g].prev = it->second;
            groups_[it->second].next = g;
          }
          stream_tail[key] = g;
        }
        open_group = g;
      }
      op.group = g;
      groups_[g].ops.push_back(o);
      ops_.push_back(op);
      op_at_[r][i] = o;
      if (op.send) {
        sends[{r, a.peer}].push_back(o);
      } else {
        recvs[{a.peer, r}].push_back(o);
        recv_for[{a.op == Op::RecvAct ? Op::Forward : Op::Backward, a.chunk, a.mb}] = o;
      }
    }
  }
  // Tag-less matching: the k-th send of a pair meets the k-th receive.
  for (auto& [pair, so] : sends) {
    const auto& ro = recvs[pair];
    ATTNRES_CHECK(so.size() == ro.size(), "simulate: rank ", pair.first, " sends ", so.size(),
                  " messages to rank ", pair.second, ", which receives ", ro.size());
    for (size_t k = 0; k < so.size(); ++k) {
      ops_[so[k]].partner = ro[k];
      ops_[ro[k]].partner = so[k];
    }
  }
  for (auto& [pair, ro] : recvs)
    ATTNRES_CHECK(sends.count(pair), "simulate: rank ", pair.second, " receives from rank ",
                  pair.first, ", which sends it nothing");
}

void Simulation::post(int r, size_t i, double now) {
  Group& g = groups_[ops_[op_at_[r][i]].group];
  if (g.post == kUnknown) {
    g.post = now;
    work_.push_back(ops_[op_at_[r][i]].group);
  }
}

void Simulation::try_op(int o) {
  CommOp& a = ops_[o];
  if (a.done != kUnknown) return;
  CommOp& b = ops_[a.partner];
  const double sa = groups_[a.group].start, sb = groups_[b.group].start;
  if (model_ != CommModel::Mpi) {
    // Rendezvous: the message moves once both sides have started.
    if (sa == kUnknown || sb == kUnknown) return;
    a.done = b.done = std::max(sa, sb) + a.msg_time;
    work_.push_back(b.group);
  } else if (a.send) {
    if (sa == kUnknown) return;
    a.done = sa + a.msg_time;  // arrived
    work_.push_back(b.group);
  } else {
    if (sa == kUnknown || b.done == kUnknown) return;
    a.done = std::max(sa, b.done);
  }
}

void Simulation::visit(int gi) {
  Group& g = groups_[gi];
  if (g.start == kUnknown) {
    if (g.post == kUnknown || (g.prev >= 0 && groups_[g.prev].done == kUnknown)) return;
    g.start = std::max(g.post, g.prev >= 0 ? groups_[g.prev].done : 0.0);
  }
  double done = g.start;
  bool all = true;
  for (int o : g.ops) {
    try_op(o);  // every op: a later one may meet a partner that started long ago
    all = all && ops_[o].done != kUnknown;
    if (all) done = std::max(done, ops_[o].done);
  }
  if (all && g.done == kUnknown) {
    g.done = done;
    if (g.next >= 0) work_.push_back(g.next);
  }
}

void Simulation::settle() {
  while (!work_.empty()) {
    const int g = work_.back();
    work_.pop_back();
    visit(g);
  }
}

SimResult Simulation::run() {
  const int P = s_.P;
  SimResult res;
  res.busy.assign(P, 0.0);
  res.end.assign(P, 0.0);
  res.peak_in_flight.assign(P, 0);
  struct Rank {
    size_t pc = 0;          // next action
    bool running = false;   // computing lists[pc]
    double left = 0;        // of the running compute, in seconds at full speed
    int in_flight = 0;
    double grads_done = 0;  // the rank's data-parallel stream is free
  };
  std::vector<Rank> rk(P);
  for (int r = 0; r < P; ++r) {
    double work = 0;
    for (const Action& a : lists_[r])
      if (a.is_compute()) work += duration(a);
    res.ideal = std::max(res.ideal, work);
  }
  double now = 0;
  while (true) {
    // Free ranks issue their communication and start what they can.
    for (int r = 0; r < P; ++r) {
      Rank& R = rk[r];
      if (R.running) continue;
      const auto& L = lists_[r];
      while (R.pc < L.size() && !L[R.pc].is_compute()) post(r, R.pc++, now);
    }
    settle();
    int running = 0;
    double wake = std::numeric_limits<double>::infinity();
    for (int r = 0; r < P; ++r) {
      Rank& R = rk[r];
      if (!R.running && R.pc < lists_[r].size()) {
        const int o = recv_of_[r][R.pc];
        const double ready = o < 0 ? 0.0 : groups_[ops_[o].group].done;
        if (ready != kUnknown && ready <= now) {
          R.running = true;
          R.left = duration(lists_[r][R.pc]);
        } else if (ready != kUnknown) {
          wake = std::min(wake, ready);
        }
      }
      running += R.running;
    }
    if (running == 0 && wake == std::numeric_limits<double>::infinity()) break;
    // Processor sharing among the running ranks.
    const double demand = running * costs_.threads;
    const double rate = costs_.cores > 0 && demand > costs_.cores ? costs_.cores / demand : 1.0;
    double next = wake;
    for (const Rank& R : rk)
      if (R.running) next = std::min(next, now + R.left / rate);
    const double dt = next - now;
    now = next;
    for (int r = 0; r < P; ++r) {
      Rank& R = rk[r];
      if (!R.running) continue;
      res.busy[r] += dt;
      R.left -= dt * rate;
      if (R.left > 1e-12 * std::max(1.0, now)) continue;
      // Done: its sends go out at `now` (the next loop posts them).
      const Action& a = lists_[r][R.pc];
      R.running = false;
      R.in_flight += a.op == Op::Forward ? 1 : -1;
      res.peak_in_flight[r] = std::max(res.peak_in_flight[r], R.in_flight);
      res.end[r] = now;
      if (a.op == Op::Backward && a.mb == s_.M - 1) {
        // The chunk's gradients are final: its data-parallel sum starts.
        R.grads_done = std::max(R.grads_done, now) + costs_.grad_sum[static_cast<size_t>(a.chunk)];
      }
      R.pc++;
    }
  }
  std::ostringstream why;
  double finish = 0, update = 0;
  for (int r = 0; r < P; ++r) {
    const Rank& R = rk[r];
    res.makespan = std::max(res.makespan, res.end[r]);
    finish = std::max({finish, res.end[r], R.grads_done});
    update = std::max(update, costs_.update[static_cast<size_t>(r)]);
    if (R.pc < lists_[r].size()) {
      res.deadlock = true;
      why << "rank " << r << " stuck before " << to_string(lists_[r][R.pc]) << "; ";
    }
  }
  // The update follows a global synchronisation (the gradient norm).
  res.step_time = finish + update;
  res.detail = why.str();
  res.bubble = res.ideal > 0 ? (res.makespan - res.ideal) / res.ideal : 0;
  return res;
}

}  // namespace

SimResult simulate(const ScheduleSpec& spec, const std::vector<std::vector<Action>>& lists,
                   CommModel model, const StepCosts& costs) {
  check_spec(spec);
  return Simulation(spec, lists, model, costs).run();
}

SimResult simulate(const ScheduleSpec& spec, const std::vector<std::vector<Action>>& lists,
                   CommModel model) {
  return simulate(spec, lists, model, StepCosts::uniform(spec));
}

}  // namespace attnres::parallel
