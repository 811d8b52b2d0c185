#!/usr/bin/env bash
# Two hosts on this machine: two network namespaces, each with its own
# hostname (a UTS namespace) and one end of a veth pair (10.77.N.1 and
# 10.77.N.2), the file system shared as a cluster's is. Open MPI's own
# remote launcher (plm rsh) starts the second host's daemon and ranks
# through a launch agent that enters that namespace instead of ssh; mpirun
# itself runs on the first host. Over TCP between the hosts (2 ranks a host):
#   - P = 2 x D = 2 equals the single process (within the data-parallel bound);
#   - the ranks count their node-local peers per host (2 processes on each
#     node, not 4: what GPU pinning and the CPU thread split use);
#   - a checkpoint written by both hosts into the shared directory resumes on
#     one host, and the run ends as the single process's;
#   - a rank killed on the second host ends the whole job within the
#     communication timeout (ATTNRES_COMM_TIMEOUT_S).
# Skipped, with the reason, where namespaces cannot be made (not root, no
# `ip netns`, no `unshare --uts`) or mpirun is not Open MPI.
source "$(dirname "$0")/lib.sh"

skip() { echo "skipped: $*"; exit 77; }
[[ $(id -u) -eq 0 ]] || skip "needs root to make network namespaces"
command -v ip >/dev/null || skip "no 'ip' (iproute2) to make network namespaces"
command -v unshare >/dev/null || skip "no 'unshare' (util-linux) for the hosts' own hostnames"
"$MPIEXEC" --version 2>&1 | grep -qE "Open MPI|OpenRTE" || skip "$MPIEXEC is not Open MPI (the launch agent is Open MPI's plm_rsh_agent)"

# Names unique to this test run: tests may run side by side.
id=$(( $$ % 100000 ))
net=$(( $$ % 250 + 1 ))
na="attnres_${id}_a" nb="attnres_${id}_b"
cleanup() { ip netns del "$na" 2>/dev/null; ip netns del "$nb" 2>/dev/null; true; }
trap cleanup EXIT
{
  ip netns add "$na" && ip netns add "$nb" &&
  ip link add "ar${id}a" type veth peer name "ar${id}b" &&
  ip link set "ar${id}a" netns "$na" && ip link set "ar${id}b" netns "$nb" &&
  ip -n "$na" addr add "10.77.$net.1/24" dev "ar${id}a" &&
  ip -n "$nb" addr add "10.77.$net.2/24" dev "ar${id}b" &&
  ip -n "$na" link set lo up && ip -n "$nb" link set lo up &&
  ip -n "$na" link set "ar${id}a" up && ip -n "$nb" link set "ar${id}b" up &&
  ip netns exec "$na" unshare --uts true
} 2>netns_err.txt || skip "cannot make network namespaces here: $(head -1 netns_err.txt)"

# The launch agent: `agent HOST COMMAND...` as ssh would run COMMAND on HOST.
cat > agent.sh <<EOF
#!/bin/bash
host=\$1; shift
case "\$host" in
  hosta) ns=$na ;;
  hostb) ns=$nb ;;
  *) echo "agent: unknown host \$host" >&2; exit 255 ;;
esac
exec ip netns exec "\$ns" unshare --uts /bin/sh -c "hostname \$host; \$*"
EOF
chmod +x agent.sh
# on_hosta CMD...: CMD on the first host (its namespace and hostname), where mpirun runs.
# OMP_NUM_THREADS unset: each rank splits its node's cores by the processes
# it counts on its node, which the log line checked below shows.
on_hosta() { ip netns exec "$na" unshare --uts env -u OMP_NUM_THREADS /bin/sh -c 'hostname hosta; exec "$@"' sh "$@"; }
# mpirun across the two hosts, 2 ranks each; ranks and daemons talk over the veth pair.
two_hosts() {
  on_hosta "$MPIEXEC" --host hosta:2,hostb:2 -np 4 --allow-run-as-root \
    --mca plm_rsh_agent "$PWD/agent.sh" --mca oob_tcp_if_include "10.77.$net.0/24" \
    --mca btl_tcp_if_include "10.77.$net.0/24" -x ATTNRES_COMM_TIMEOUT_S "$@"
}
export ATTNRES_COMM_TIMEOUT_S=30

# Where each rank runs, as the launcher tells it (the trainer reads the same).
two_hosts /bin/sh -c 'echo "$OMPI_COMM_WORLD_RANK $(hostname) $OMPI_COMM_WORLD_LOCAL_RANK"' > where.txt 2>where_err.txt \
  || { cat where_err.txt; fail "mpirun across the two hosts"; }
[[ $(sort -n where.txt | tr '\n' ';') == "0 hosta 0;1 hosta 1;2 hostb 0;3 hostb 1;" ]] \
  || { cat where.txt; fail "expected ranks 0, 1 on hosta and 2, 3 on hostb, local ranks 0 and 1 on each"; }
pass "Open MPI's rsh launcher through the agent: ranks 0, 1 on hosta, 2, 3 on hostb (local ranks 0, 1 each)"

reference_run

two_hosts "$BIN" train base.json --parallel.pipeline=2 --parallel.data=2 --training.grad_accum=2 \
  --checkpoint.dir="$PWD/ck_h" --run.dir="$PWD/run_h" 2>log_h.txt || { cat log_h.txt; fail "P=2 x D=2 on two hosts"; }
compare_losses run_s/metrics.jsonl run_h/metrics.jsonl 1e-5 || fail "two hosts: losses differ from the single process"
grep -q "2 processes on this node" log_h.txt || { grep -i "thread" log_h.txt; fail "rank 0 did not count 2 processes on its node"; }
pass "P=2 x D=2 over TCP between two hosts = the single process (final loss $(last_loss run_h/metrics.jsonl) against $(last_loss run_s/metrics.jsonl)); each node counts 2 local processes"

# A checkpoint both hosts wrote (stage 0 on hosta, stage 1 on hostb), resumed on one host.
two_hosts "$BIN" train base.json --parallel.pipeline=2 --parallel.data=2 --training.grad_accum=2 \
  --checkpoint.dir="$PWD/ck_r" --run.dir="$PWD/run_r" --run.stop_after=4 2>log_r.txt \
  || { cat log_r.txt; fail "two hosts, first half"; }
[[ -f ck_r/step_00000004/model-00002-of-00002.safetensors ]] || { ls ck_r/*; fail "no shard of stage 1"; }
run_np 2 "$BIN" train base.json --parallel.pipeline=2 --checkpoint.dir=ck_r --run.dir=run_r \
  --checkpoint.resume=auto 2>log_r2.txt || { cat log_r2.txt; fail "resume on one host"; }
grep -q "resumed from ck_r/step_00000004" log_r2.txt || { cat log_r2.txt; fail "did not resume from step 4"; }
compare_losses run_s/metrics.jsonl run_r/metrics.jsonl 1e-5 || fail "resumed on one host: losses differ"
pass "a checkpoint written by both hosts resumes on one host (P=2) and ends as the single process"

# A rank on hostb killed: the whole job ends, within the communication timeout.
two_hosts "$BIN" train base.json --parallel.pipeline=2 --parallel.data=2 --training.grad_accum=2 \
  --training.steps=100000 --checkpoint.dir="$PWD/ck_k" --run.dir="$PWD/run_k" >log_k.txt 2>&1 &
job=$!
# victim_on_hostb: once the job trains, a rank process of it on hostb.
victim=""
victim_on_hostb() {
  local p
  grep -qs '"loss"' run_k/metrics.jsonl || return 1
  for p in $(ip netns pids "$nb"); do
    tr '\0' ' ' < /proc/$p/cmdline 2>/dev/null | grep -q "^$BIN train" && { victim=$p; return 0; }
  done
  return 1
}
on_wait_timeout() { cat log_k.txt; }
wait_for 60 "a training rank of the job on hostb" victim_on_hostb
t0=$SECONDS
kill -KILL "$victim"
rc=0
wait_for $((ATTNRES_COMM_TIMEOUT_S + 10)) "the job to end after its rank on hostb was killed" gone $job
wait $job || rc=$?
took=$((SECONDS - t0))
[[ $rc -ne 0 ]] || { cat log_k.txt; fail "the job with a dead rank exited 0"; }
((took <= ATTNRES_COMM_TIMEOUT_S)) || fail "the job took $took s to end, more than the communication timeout"
pass "a rank killed on hostb: the job ended in $took s (exit $rc; communication timeout $ATTNRES_COMM_TIMEOUT_S s)"
echo "all two_hosts checks passed"
