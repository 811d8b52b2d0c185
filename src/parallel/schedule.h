// The pipeline schedule as data (docs/parallel.md "Schedule as data").
//
// A pure function of (P, V, M, rank) gives the rank's ordered action list:
// compute actions F(chunk, mb) / B(chunk, mb) and the point-to-point
// messages they need. The executor only interprets the list; the validator
// and the simulator (parallel/simulator.h) check every list the program can produce.
//
// Compute order:
//  - V = 1: 1F1B. Rank r runs min(P-r-1, M) warm-up forwards, then alternates
//    one forward and one backward, then drains the remaining backwards.
//  - V > 1: Megatron's interleaved 1F1B with microbatch groups of P. Virtual
//    step k (0 .. M*V-1) runs forward chunk (k mod PV) div P of microbatch
//    (k div PV)*P + k mod P; the backward of step k runs the mirrored chunk
//    V-1 - (k mod PV) div P. Warm-up: min(2(P-r-1) + (V-1)P, M*V) forwards.
//  - forward only (evaluation): microbatch by microbatch, chunks ascending.
//
// Messages (one per chunk boundary, microbatch and direction):
//  - "act"  c -> c+1 after F(c, mb), needed by F(c+1, mb);
//  - "grad" c -> c-1 after B(c, mb), needed by B(c-1, mb).
// A send is issued right after the compute that produced it. A receive is
// posted one group before the first group issued at or after the time its
// message is sent in a zero-latency run of the compute orders (t_b = 2 t_f),
// so that it is waiting when the message leaves, as NCCL's rendezvous needs;
// never later than the group just before the compute that needs it; and, for every
// ordered pair of ranks (a -> b), b posts its receives in exactly the order
// of a's sends. That is what tag-less transports (NCCL) match on; with P = 2
// the previous and next rank are the same peer, and activations and
// gradients share one FIFO.
//
// In the list, the communication actions between two compute actions form one
// group: the executor issues them together (one NCCL group / a batch of MPI
// non-blocking requests), then runs the next compute action, waiting for its
// receive (if any) right before it.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace attnres::parallel {

enum class Op : uint8_t {
  Forward,   // F(chunk, mb)
  Backward,  // B(chunk, mb)
  SendAct,   // send F(chunk, mb)'s output to chunk+1's rank
  RecvAct,   // receive chunk-1's output for F(chunk, mb)
  SendGrad,  // send B(chunk, mb)'s input gradient to chunk-1's rank
  RecvGrad,  // receive chunk+1's gradient for B(chunk, mb)
};

struct Action {
  Op op = Op::Forward;
  int chunk = 0;
  int mb = 0;
  int peer = -1;  // pipeline rank of the other side (comm actions only)

  bool is_compute() const { return op == Op::Forward || op == Op::Backward; }
  bool is_send() const { return op == Op::SendAct || op == Op::SendGrad; }
  bool is_recv() const { return op == Op::RecvAct || op == Op::RecvGrad; }
  bool operator==(const Action& o) const {
    return op == o.op && chunk == o.chunk && mb == o.mb && peer == o.peer;
  }
};

// "F4.0", "B4.0" (the spec's notation, chunk = global stage); comm actions as
// "send act 4.0 -> r1", "recv grad 5.0 <- r1".
std::string to_string(const Action& a);

struct ScheduleSpec {
  int P = 1;                  // pipeline ranks
  int V = 1;                  // virtual stages (chunks) per rank
  int M = 1;                  // microbatches per step
  bool forward_only = false;  // evaluation: forwards only
  int C() const { return P * V; }
};

// An action list as text and back: the actions' to_string forms separated
// by spaces ("F0.0 send act 0.0 -> r1 F0.1 ..."). parse_actions also takes
// the compact notation of docs/parallel.md: "F0.0-F0.3" is F0.0 F0.1 F0.2
// F0.3, and "|" (a phase mark) is skipped. Throws attnres::Error on bad text.
std::string to_text(const std::vector<Action>& list);
std::vector<Action> parse_actions(const std::string& text);

// A rank's action list, one numbered action a line, for error messages: the
// action at index `mark` is flagged with ">>" (mark >= list.size(): none).
std::string format_actions(const std::vector<Action>& list, size_t mark);

// Throws attnres::Error when the spec cannot be scheduled (P, V, M < 1, or
// V > 1 with M % P != 0).
void check_spec(const ScheduleSpec& spec);

// The compute actions of one rank, in order.
std::vector<Action> compute_order(const ScheduleSpec& spec, int rank);
// Warm-up forwards of a rank (the 1F1B steady phase starts after them).
int warmup_forwards(const ScheduleSpec& spec, int rank);

// The full action list of one rank (compute + communication).
std::vector<Action> rank_schedule(const ScheduleSpec& spec, int rank);
// All ranks' lists, index = rank.
std::vector<std::vector<Action>> pipeline_schedule(const ScheduleSpec& spec);

// Checks every invariant (throws attnres::InternalError naming the rank, the
// action and the broken rule, with the rank's list and the action marked): each (chunk, mb) of the rank's chunks has one F and
// one B, F before B, forwards of a microbatch in increasing chunk order and
// backwards in decreasing order; every compute that needs a message has its
// receive earlier in the list and every output is sent right after its
// compute; for every ordered pair of ranks the sends of one equal the
// receives of the other, message for message, in the same order.
void validate_schedule(const ScheduleSpec& spec, const std::vector<std::vector<Action>>& lists);

// Text dump: one line per rank with the compute order, "|" separating
// warm-up, steady state and cool-down, e.g.
//   rank0: F0.0 F0.1 ... | F0.6 B4.0 ... | B0.2 ...
// With `comm`, every action on its own line, groups numbered.
std::string dump_schedule(const ScheduleSpec& spec, bool comm = false);

}  // namespace attnres::parallel
