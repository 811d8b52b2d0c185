#include "parallel/schedule.h"

#include <algorithm>
#include <map>
#include <set>
#include <sstream>
#include <stdexcept>
#include <tuple>

#include "core/error.h"

namespace attnres::parallel {

namespace {

// A message is identified by its kind, the chunk that sends it and the microbatch.
struct MsgId {
  bool grad = false;
  int from_chunk = 0;
  int mb = 0;
  bool operator<(const MsgId& o) const {
    return std::tie(grad, from_chunk, mb) < std::tie(o.grad, o.from_chunk, o.mb);
  }
  bool operator==(const MsgId& o) const {
    return grad == o.grad && from_chunk == o.from_chunk && mb == o.mb;
  }
};

std::string msg_str(const MsgId& m) {
  std::ostringstream os;
  os << (m.grad ? "grad " : "act ") << m.from_chunk << "->"
     << (m.grad ? m.from_chunk - 1 : m.from_chunk + 1) << " mb " << m.mb;
  return os.str();
}

// The message a communication action moves.
MsgId msg_of(const Action& a) {
  switch (a.op) {
    case Op::SendAct:
      return {false, a.chunk, a.mb};
    case Op::RecvAct:
      return {false, a.chunk - 1, a.mb};
    case Op::SendGrad:
      return {true, a.chunk, a.mb};
    case Op::RecvGrad:
      return {true, a.chunk + 1, a.mb};
    default:
      fail("msg_of: ", to_string(a), " is not a communication action");
  }
}

// Does compute action `a` need a message, and which?
bool needs_msg(const ScheduleSpec& s, const Action& a, MsgId& m) {
  if (a.op == Op::Forward && a.chunk > 0) {
    m = {false, a.chunk - 1, a.mb};
    return true;
  }
  if (a.op == Op::Backward && a.chunk < s.C() - 1) {
    m = {true, a.chunk + 1, a.mb};
    return true;
  }
  return false;
}

// Does compute action `a` produce a message, and which (with its receiver)?
bool makes_msg(const ScheduleSpec& s, const Action& a, Action& send) {
  if (a.op == Op::Forward && a.chunk < s.C() - 1) {
    send = {Op::SendAct, a.chunk, a.mb, (a.chunk + 1) % s.P};
    return true;
  }
  if (a.op == Op::Backward && a.chunk > 0) {
    send = {Op::SendGrad, a.chunk, a.mb, (a.chunk - 1) % s.P};
    return true;
  }
  return false;
}

Action recv_for(const ScheduleSpec& s, const MsgId& m) {
  if (m.grad) return {Op::RecvGrad, m.from_chunk - 1, m.mb, m.from_chunk % s.P};
  return {Op::RecvAct, m.from_chunk + 1, m.mb, m.from_chunk % s.P};
}

}  // namespace

std::string to_string(const Action& a) {
  std::ostringstream os;
  switch (a.op) {
    case Op::Forward:
      os << 'F' << a.chunk << '.' << a.mb;
      break;
    case Op::Backward:
      os << 'B' << a.chunk << '.' << a.mb;
      break;
    case Op::SendAct:
      os << "send act " << a.chunk << '.' << a.mb << " -> r" << a.peer;
      break;
    case Op::RecvAct:
      os << "recv act " << a.chunk << '.' << a.mb << " <- r" << a.peer;
      break;
    case Op::SendGrad:
      os << "send grad " << a.chunk << '.' << a.mb << " -> r" << a.peer;
      break;
    case Op::RecvGrad:
      os << "recv grad " << a.chunk << '.' << a.mb << " <- r" << a.peer;
      break;
  }
  return os.str();
}

std::string to_text(const std::vector<Action>& list) {
  std::string s;
  for (const auto& a : list) s += (s.empty() ? "" : " ") + to_string(a);
  return s;
}

std::vector<Action> parse_actions(const std::string& text) {
  std::vector<Action> out;
  std::istringstream is(text);
  std::string tok;
  // The digits of `t` as an int; else an error: `token` is not `form`.
  auto whole_number = [](const std::string& t, const std::string& token, const char* form) {
    size_t used = 0;
    int n = -1;
    try {
      n = std::stoi(t, &used);
    } catch (const std::logic_error&) {
      used = 0;
    }
    if (t.empty() || used != t.size() || n < 0)
      fail("schedule text: '", token, "' is not ", form);
    return n;
  };
  // "c.mb" -> (chunk, mb)
  auto chunk_mb = [&](const std::string& t, Action& a) {
    const auto dot = t.find('.');
    if (dot == std::string::npos) fail("schedule text: '", t, "' is not chunk.microbatch");
    a.chunk = whole_number(t.substr(0, dot), t, "chunk.microbatch");
    a.mb = whole_number(t.substr(dot + 1), t, "chunk.microbatch");
  };
  auto compute = [&](const std::string& t) {
    if (t.size() < 2 || (t[0] != 'F' && t[0] != 'B'))
      fail("schedule text: unknown action '", t, "' (F<c>.<mb>, B<c>.<mb>, send ..., recv ...)");
    Action a;
    a.op = t[0] == 'F' ? Op::Forward : Op::Backward;
    chunk_mb(t.substr(1), a);
    return a;
  };
  while (is >> tok) {
    if (tok == "|") continue;
    if (tok == "send" || tok == "recv") {
      // send act|grad c.mb -> rN  /  recv act|grad c.mb <- rN
      const bool send = tok == "send";
      std::string kind, cm, arrow, peer;
      if (!(is >> kind >> cm >> arrow >> peer) || (kind != "act" && kind != "grad") ||
          arrow != (send ? "->" : "<-") || peer.size() < 2 || peer[0] != 'r')
        fail("schedule text: malformed '", tok, " ", kind, " ", cm, " ", arrow, " ", peer,
             "' (expected '", send ? "send act 4.0 -> r1" : "recv act 4.0 <- r1", "')");
      Action a;
      a.op = kind == "act" ? (send ? Op::SendAct : Op::RecvAct)
                           : (send ? Op::SendGrad : Op::RecvGrad);
      chunk_mb(cm, a);
      a.peer = whole_number(peer.substr(1), peer, "r<rank>");
      out.push_back(a);
      continue;
    }
    const auto dash = tok.find('-');
    if (dash == std::string::npos) {
      out.push_back(compute(tok));
      continue;
    }
    const Action a = compute(tok.substr(0, dash)), b = compute(tok.substr(dash + 1));
    if (a.op != b.op || a.chunk != b.chunk || b.mb < a.mb)
      fail("schedule text: range '", tok, "' must run over the microbatches of one chunk");
    for (int mb = a.mb; mb <= b.mb; ++mb) out.push_back({a.op, a.chunk, mb});
  }
  return out;
}

std::string format_actions(const std::vector<Action>& list, size_t mark) {
  std::ostringstream os;
  for (size_t i = 0; i < list.size(); ++i)
    os << (i == mark ? "  >> " : "     ") << i << "  " << to_string(list[i]) << "\n";
  return os.str();
}

void check_spec(const ScheduleSpec& s) {
  if (s.P < 1) fail("pipeline schedule: P = ", s.P, " (parallel.pipeline) must be >= 1");
  if (s.V < 1) fail("pipeline schedule: V = ", s.V, " (parallel.virtual_stages) must be >= 1");
  if (s.M < 1) fail("pipeline schedule: M = ", s.M, " (training.grad_accum) must be >= 1");
  if (s.V > 1 && !s.forward_only && s.M % s.P != 0)
    fail("pipeline schedule: the interleaved schedule (parallel.virtual_stages = ", s.V,
         ") needs training.grad_accum (microbatches, ", s.M,
         ") divisible by parallel.pipeline = ", s.P);
}

int warmup_forwards(const ScheduleSpec& s, int r) {
  if (s.forward_only) return s.M * s.V;
  if (s.V == 1) return std::min(s.P - r - 1, s.M);
  return std::min(2 * (s.P - r - 1) + (s.V - 1) * s.P, s.M * s.V);
}

std::vector<Action> compute_order(const ScheduleSpec& s, int r) {
  check_spec(s);
  ATTNRES_CHECK(r >= 0 && r < s.P, "rank ", r, " of ", s.P);
  std::vector<Action> out;
  if (s.forward_only) {
    for (int mb = 0; mb < s.M; ++mb)
      for (int v = 0; v < s.V; ++v) out.push_back({Op::Forward, v * s.P + r, mb});
    return out;
  }
  const int T = s.M * s.V;  // virtual microbatches of this rank
  const int W = warmup_forwards(s, r);
  const int PV = s.P * s.V;
  // Virtual step k -> (chunk, microbatch). V = 1 is plain 1F1B: chunk r, mb k.
  auto fwd = [&](int k) -> Action {
    if (s.V == 1) return {Op::Forward, r, k};
    return {Op::Forward, ((k % PV) / s.P) * s.P + r, (k / PV) * s.P + k % s.P};
  };
  auto bwd = [&](int k) -> Action {
    if (s.V == 1) return {Op::Backward, r, k};
    return {Op::Backward, (s.V - 1 - (k % PV) / s.P) * s.P + r, (k / PV) * s.P + k % s.P};
  };
  for (int k = 0; k < W; ++k) out.push_back(fwd(k));
  for (int i = 0; i < T - W; ++i) {
    out.push_back(fwd(W + i));
    out.push_back(bwd(i));
  }
  for (int k = T - W; k < T; ++k) out.push_back(bwd(k));
  return out;
}

std::vector<std::vector<Action>> pipeline_schedule(const ScheduleSpec& s) {
  check_spec(s);
  std::vector<std::vector<Action>> comp(s.P);
  for (int r = 0; r < s.P; ++r) comp[r] = compute_order(s, r);

  // Where each message is consumed: (rank, compute position).
  std::map<MsgId, int> consumer_pos;
  for (int r = 0; r < s.P; ++r)
    for (size_t t = 0; t < comp[r].size(); ++t) {
      MsgId m;
      if (needs_msg(s, comp[r][t], m)) consumer_pos[m] = static_cast<int>(t);
    }
  // Per ordered pair (q -> r): messages in q's send order.
  std::map<std::pair<int, int>, std::vector<MsgId>> seq;
  for (int q = 0; q < s.P; ++q)
    for (const Action& a : comp[q]) {
      Action send;
      if (makes_msg(s, a, send)) seq[{q, send.peer}].push_back(msg_of(send));
    }
  // When is each message sent, and when does each rank reach each compute
  // boundary? A zero-latency run of the compute orders with t_b = 2 t_f
  // (any positive times give the same order of events).
  std::map<MsgId, double> sent_at;
  std::vector<std::vector<double>> boundary_at(s.P);  // [r][t]: issue time of group t
  {
    std::vector<size_t> next(s.P, 0);
    std::vector<double> now(s.P, 0.0);
    for (int r = 0; r < s.P; ++r) boundary_at[r].push_back(0.0);
    bool progress = true;
    while (progress) {
      progress = false;
      for (int r = 0; r < s.P; ++r) {
        while (next[r] < comp[r].size()) {
          const Action& a = comp[r][next[r]];
          MsgId m;
          double ready = 0;
          if (needs_msg(s, a, m)) {
            auto it = sent_at.find(m);
            if (it == sent_at.end()) break;
            ready = it->second;
          }
          now[r] = std::max(now[r], ready) + (a.op == Op::Forward ? 1.0 : 2.0);
          Action send;
          if (makes_msg(s, a, send)) sent_at[msg_of(send)] = now[r];
          boundary_at[r].push_back(now[r]);
          ++next[r];
          progress = true;
        }
      }
    }
    for (int r = 0; r < s.P; ++r)
      ATTNRES_CHECK(next[r] == comp[r].size(), "compute orders deadlock at rank ", r);
  }
  // Receive groups: group t is issued right after compute t-1 (group 0 before
  // the first compute). A receive goes one group before the first group
  // issued at or after the time its message is sent, so that it is waiting
  // when the message leaves even when messages take time: NCCL moves a
  // message only once both sides have started (rendezvous), and a receive
  // posted late would add its whole transfer to the consumer's wait
  // (parallel/simulator.h measures this; one group of lead removes it on the
  // whole test grid). Never later than the group just before its consumer.
  // Per peer, receives must be posted in the sender's order; where a later
  // message is needed sooner, the earlier ones move up with it.
  std::vector<std::vector<std::vector<Action>>> recv_groups(s.P);
  for (int r = 0; r < s.P; ++r) recv_groups[r].resize(comp[r].size() + 1);
  for (auto& [pair, msgs] : seq) {
    const int r = pair.second;
    const auto& bt = boundary_at[r];
    std::vector<int> group(msgs.size());
    int g = static_cast<int>(comp[r].size());
    for (size_t i = msgs.size(); i-- > 0;) {
      auto it = consumer_pos.find(msgs[i]);
      ATTNRES_CHECK(it != consumer_pos.end(), "message ", msg_str(msgs[i]), " has no consumer");
      const double ts = sent_at.at(msgs[i]);
      const int first = static_cast<int>(std::lower_bound(bt.begin(), bt.end(), ts) - bt.begin());
      g = std::min({g, it->second, std::max(0, first - 1)});
      group[i] = g;
    }
    for (size_t i = 0; i < msgs.size(); ++i)
      recv_groups[r][group[i]].push_back(recv_for(s, msgs[i]));
  }
  // Assemble: [group 0] a_0 [send of a_0, group 1] a_1 ...
  std::vector<std::vector<Action>> out(s.P);
  for (int r = 0; r < s.P; ++r) {
    for (size_t t = 0; t <= comp[r].size(); ++t) {
      if (t > 0) {
        Action send;
        if (makes_msg(s, comp[r][t - 1], send)) out[r].push_back(send);
      }
      // Within a group, receives are ordered by peer and (stably) by the
      // sender's order, which keeps each peer's FIFO.
      auto& g = recv_groups[r][t];
      std::stable_sort(g.begin(), g.end(),
                       [](const Action& a, const Action& b) { return a.peer < b.peer; });
      for (const Action& a : g) out[r].push_back(a);
      if (t < comp[r].size()) out[r].push_back(comp[r][t]);
    }
  }
  return out;
}

std::vector<Action> rank_schedule(const ScheduleSpec& s, int rank) {
  ATTNRES_CHECK(rank >= 0 && rank < s.P, "rank ", rank, " of ", s.P);
  return pipeline_schedule(s)[rank];
}

void validate_schedule(const ScheduleSpec& s, const std::vector<std::vector<Action>>& lists) {
  check_spec(s);
  const int C = s.C();
  if (static_cast<int>(lists.size()) != s.P)
    fail_internal("schedule: ", lists.size(), " action lists for P = ", s.P);
  auto bad = [&](int r, size_t i, const auto&... why) {
    fail_internal("schedule P=", s.P, " V=", s.V, " M=", s.M, ": rank ", r, ", action ", i, " (",
                  to_string(lists[r][i]), "): ", why..., "\nrank ", r, "'s action list:\n",
                  format_actions(lists[r], i));
  };
  // Per ordered pair: the messages sent (in the sender's order) and received
  // (in the receiver's order).
  std::map<std::pair<int, int>, std::vector<MsgId>> sent, received;
  for (int r = 0; r < s.P; ++r) {
    const auto& L = lists[r];
    std::map<std::pair<int, int>, int> fpos, bpos;  // (chunk, mb) -> index
    std::set<MsgId> recv_posted, sends;
    std::map<int, int> last_fwd_chunk, last_bwd_chunk;  // mb -> chunk
    for (size_t i = 0; i < L.size(); ++i) {
      const Action& a = L[i];
      if (a.mb < 0 || a.mb >= s.M) bad(r, i, "microbatch out of range");
      if (a.chunk < 0 || a.chunk >= C) bad(r, i, "chunk out of range");
      if (a.chunk % s.P != r) bad(r, i, "chunk ", a.chunk, " does not live on rank ", r);
      if (a.is_compute()) {
        if (a.peer != -1) bad(r, i, "compute action with a peer");
        const auto key = std::make_pair(a.chunk, a.mb);
        if (a.op == Op::Forward) {
          if (fpos.count(key)) bad(r, i, "second forward");
          fpos[key] = static_cast<int>(i);
          auto it = last_fwd_chunk.find(a.mb);
          if (it != last_fwd_chunk.end() && it->second > a.chunk)
            bad(r, i, "forwards of a microbatch out of chunk order (after chunk ", it->second, ")");
          last_fwd_chunk[a.mb] = a.chunk;
        } else {
          if (s.forward_only) bad(r, i, "backward in a forward-only schedule");
          if (bpos.count(key)) bad(r, i, "second backward");
          if (!fpos.count(key)) bad(r, i, "backward before its forward");
          bpos[key] = static_cast<int>(i);
          auto it = last_bwd_chunk.find(a.mb);
          if (it != last_bwd_chunk.end() && it->second < a.chunk)
            bad(r, i, "backwards of a microbatch out of chunk order (after chunk ", it->second,
                ")");
          last_bwd_chunk[a.mb] = a.chunk;
        }
        MsgId need;
        if (needs_msg(s, a, need) && !(a.op == Op::Backward && s.forward_only) &&
            !recv_posted.count(need))
          bad(r, i, "needs ", msg_str(need), " but no receive was posted before it");
        Action send;
        if (makes_msg(s, a, send) && !(s.forward_only && a.chunk == C - 1)) {
          if (i + 1 >= L.size() || !(L[i + 1] == send))
            bad(r, i, "its output is not sent right after it (expected ", to_string(send), ")");
        }
        continue;
      }
      // Communication action: well-formed, and tied to a compute action.
      const MsgId m = msg_of(a);
      if (m.grad && s.forward_only) bad(r, i, "gradient message in a forward-only schedule");
      if (m.from_chunk < 0 || m.from_chunk >= C ||
          (m.grad ? m.from_chunk < 1 : m.from_chunk > C - 2))
        bad(r, i, "no such chunk boundary");
      const int other_chunk = m.grad ? (a.is_send() ? a.chunk - 1 : a.chunk + 1)
                                     : (a.is_send() ? a.chunk + 1 : a.chunk - 1);
      if (a.peer != other_chunk % s.P) bad(r, i, "peer should be rank ", other_chunk % s.P);
      if (a.is_send()) {
        if (sends.count(m)) bad(r, i, "sent twice");
        sends.insert(m);
        const Op producer = m.grad ? Op::Backward : Op::Forward;
        if (i == 0 ||
            !(L[i - 1].op == producer && L[i - 1].chunk == a.chunk && L[i - 1].mb == a.mb))
          bad(r, i, "a send must directly follow the compute that produced it");
        sent[{r, a.peer}].push_back(m);
      } else {
        if (recv_posted.count(m)) bad(r, i, "received twice");
        recv_posted.insert(m);
        received[{a.peer, r}].push_back(m);
      }
    }
    // Completeness: every chunk of this rank, every microbatch.
    for (int c = r; c < C; c += s.P)
      for (int mb = 0; mb < s.M; ++mb) {
        if (!fpos.count({c, mb}))
          fail_internal("schedule: rank ", r, " never runs F", c, ".", mb, "\nrank ", r,
                        "'s action list:\n", format_actions(L, L.size()));
        if (!s.forward_only && !bpos.count({c, mb}))
          fail_internal("schedule: rank ", r, " never runs B", c, ".", mb, "\nrank ", r,
                        "'s action list:\n", format_actions(L, L.size()));
      }
  }
  // Per ordered pair, message for message in the same order.
  std::set<std::pair<int, int>> pairs;
  for (auto& kv : sent) pairs.insert(kv.first);
  for (auto& kv : received) pairs.insert(kv.first);
  for (const auto& pr : pairs) {
    const auto& a = sent[pr];
    const auto& b = received[pr];
    const size_t n = std::max(a.size(), b.size());
    for (size_t i = 0; i < n; ++i) {
      if (i >= a.size() || i >= b.size() || !(a[i] == b[i]))
        fail_internal("schedule P=", s.P, " V=", s.V, " M=", s.M, ": rank ", pr.first, " -> rank ",
             pr.second, " message ", i, ": sender sends ",
             i < a.size() ? msg_str(a[i]) : std::string("nothing"), ", receiver expects ",
             i < b.size() ? msg_str(b[i]) : std::string("nothing"),
             " (per-peer order must match on both sides)");
    }
  }
}

std::string dump_schedule(const ScheduleSpec& s, bool comm) {
  auto lists = pipeline_schedule(s);
  std::ostringstream os;
  for (int r = 0; r < s.P; ++r) {
    if (!comm) {
      os << "rank" << r << ":";
      const int W = warmup_forwards(s, r);
      const int n = static_cast<int>(compute_order(s, r).size());
      int k = 0;
      for (const Action& a : lists[r]) {
        if (!a.is_compute()) continue;
        // Steady state = the alternating 1F1B part: computes W .. n-W-1.
        if (!s.forward_only && (k == W || k == n - W) && W > 0 && W < n) os << " |";
        os << ' ' << to_string(a);
        ++k;
      }
      os << '\n';
      continue;
    }
    os << "rank " << r << ":\n";
    int group = 0;
    bool open = false;
    for (const Action& a : lists[r]) {
      if (a.is_compute()) {
        os << "    " << to_string(a) << '\n';
        open = false;
        continue;
      }
      if (!open) {
        os << "  group " << group++ << ":\n";
        open = true;
      }
      os << "      " << to_string(a) << '\n';
    }
  }
  return os.str();
}

}  // namespace attnres::parallel
