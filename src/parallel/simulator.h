// A timed model of one pipeline step (docs/parallel.md "The simulator").
//
// It runs every rank's action list (parallel/schedule.h) as the executor
// does, in simulated time: a compute action takes its chunk's forward or
// backward time, a message takes latency + bytes / bandwidth on its link,
// and the transport decides when a message may move (CommModel). After the
// pipeline, each chunk's data-parallel gradient sum (started by the runtime
// as soon as the chunk's last backward is done, one after another on the
// rank's data-parallel stream) and the optimizer update complete the step.
//
// Ranks that share compute units (several MPI ranks on one CPU) are modelled
// by processor sharing: while k ranks compute with `threads` threads each on
// `cores` cores, each runs at min(1, cores / (k * threads)) of its own speed.
// On GPUs (one rank per device) leave cores = 0.
//
// All inputs are numbers (see parallel/costs.h for where they come from);
// the simulator itself knows nothing about models or hardware.
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "parallel/schedule.h"

namespace attnres::parallel {

// How long a message takes on a link: latency + bytes / bandwidth.
struct LinkCost {
  double latency = 0;        // seconds
  double bytes_per_sec = 0;  // 0 = infinite
  double time(double bytes) const {
    return bytes <= 0 ? 0.0 : latency + (bytes_per_sec > 0 ? bytes / bytes_per_sec : 0.0);
  }
};

struct StepCosts {
  std::vector<double> fwd, bwd;    // seconds per global chunk, one microbatch
  std::vector<double> msg_bytes;   // [c]: bytes of the message into chunk c (and of the
                                   // gradient back from c); [0] unused
  // The link between two pipeline ranks (from -> to); default: free.
  std::function<LinkCost(int from, int to)> link;
  std::vector<double> grad_sum;    // per global chunk: its data-parallel gradient sum (0: D = 1)
  std::vector<double> update;      // per pipeline rank: the step's work after the pipeline
                                   // (tied-embedding sum, norm, optimizer)
  double cores = 0;                // compute units the ranks share; 0 = one device each
  double threads = 1;              // compute units one rank uses (with cores > 0)

  // Every chunk forward t_f and backward t_b, nothing else: the unit model
  // of `attnres inspect schedule` and of the schedule tests.
  static StepCosts uniform(const ScheduleSpec& spec, double t_f = 1.0, double t_b = 2.0);
};

// When a message may move.
enum class CommModel {
  // MPI non-blocking: a message leaves when it is sent (one at a time per
  // link) and its receive completes once it has arrived and was posted.
  Mpi,
  // NCCL as the executor drives it: every directed link between two ranks
  // has its own communicator and stream on both sides, each send or receive
  // its own operation. A link's operations run in order; a send and its
  // receive move the message once both have started (rendezvous), and the
  // next operation on the link starts when it is done.
  Nccl,
  // NCCL with one stream per rank and the schedule's groups as NCCL groups
  // (the executor before per-link streams): a group starts when the previous
  // one is done, so a receive waiting for a busy peer holds up every later
  // send of the rank. Kept to show what per-link streams remove.
  NcclOneStream,
};
const char* comm_model_name(CommModel m);

struct SimResult {
  bool deadlock = false;
  std::string detail;        // what every rank waits for, when deadlocked
  double makespan = 0;       // end of the last compute
  double step_time = 0;      // makespan, then gradient sums and update (the whole step)
  double ideal = 0;          // the busiest rank's compute time (no bubble, no communication)
  double bubble = 0;         // (makespan - ideal) / ideal
  std::vector<double> busy;  // per rank: wall time spent computing
  std::vector<double> end;   // per rank: end of its last compute
  std::vector<int> peak_in_flight;  // per rank: most microbatch-chunks forwarded, not yet backwarded
};

// Throws attnres::Error when the costs do not match the spec (sizes).
SimResult simulate(const ScheduleSpec& spec, const std::vector<std::vector<Action>>& lists,
                   CommModel model, const StepCosts& costs);
// Unit costs (StepCosts::uniform).
SimResult simulate(const ScheduleSpec& spec, const std::vector<std::vector<Action>>& lists,
                   CommModel model = CommModel::Mpi);

}  // namespace attnres::parallel
