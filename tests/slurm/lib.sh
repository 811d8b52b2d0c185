# A private single-node Slurm for the tests, from Debian's packages (slurmctld,
# slurmd, slurm-client, munge): munged, slurmctld and slurmd started on this
# machine with a config written here (no cgroups, no accounting, its own ports
# and state under $1), stopped by stop_slurm. Sourced after tests/cli/lib.sh.
#   start_slurm DIR   sets SLURM_CONF (exported); on failure prints why and
#                     exits 77 (skipped) with the daemons' last log lines
#   stop_slurm        cancels every job, stops the daemons (idempotent)

slurm_missing() {
  local b
  for b in munged slurmctld slurmd sbatch squeue scancel scontrol sinfo; do
    command -v "$b" >/dev/null || { echo "$b"; return; }
  done
}

start_slurm() {
  SLURM_DIR="$1"
  local missing host cpus port
  missing=$(slurm_missing)
  if [[ -n $missing ]]; then
    echo "skipped: Slurm cannot be started here: $missing not found (scripts/install_deps.sh installs slurmctld slurmd slurm-client munge)"
    exit 77
  fi
  if [[ $(id -u) -ne 0 ]]; then
    echo "skipped: Slurm cannot be started here: slurmd must run as root to start jobs (this test runs as $(id -un))"
    exit 77
  fi
  mkdir -p "$SLURM_DIR"/{state,spool}
  chmod 700 "$SLURM_DIR"
  head -c 1024 /dev/urandom > "$SLURM_DIR/munge.key"
  chmod 400 "$SLURM_DIR/munge.key"
  munged --force --key-file="$SLURM_DIR/munge.key" --socket="$SLURM_DIR/munge.sock" \
    --pid-file="$SLURM_DIR/munged.pid" --log-file="$SLURM_DIR/munged.log" \
    --seed-file="$SLURM_DIR/munge.seed" \
    || { tail -5 "$SLURM_DIR/munged.log" 2>/dev/null; echo "skipped: Slurm cannot be started here: munged failed"; exit 77; }
  host=$(hostname -s)
  cpus=$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)  # nproc heeds OMP_NUM_THREADS
  # Ports of our own, away from a system Slurm's 6817/6818 and from each other.
  # SchedulerParameters: the main and backfill schedulers every second, not
  # every 60 s and 30 s, so that a freed CPU or a requeued task is taken at
  # once (the sweep test took 92 s before, 60 s after).
  port=$((20000 + ($$ % 20000) * 2))
  cat > "$SLURM_DIR/slurm.conf" <<CONF
ClusterName=attnres-test
SlurmctldHost=$host
SlurmctldPort=$port
SlurmdPort=$((port + 1))
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$SLURM_DIR/munge.sock,cred_expire=10
# (cred_expire: a requeued job waits this long before it may start again; default 120 s)
StateSaveLocation=$SLURM_DIR/state
SlurmdSpoolDir=$SLURM_DIR/spool
SlurmctldPidFile=$SLURM_DIR/slurmctld.pid
SlurmdPidFile=$SLURM_DIR/slurmd.pid
SlurmctldLogFile=$SLURM_DIR/slurmctld.log
SlurmdLogFile=$SLURM_DIR/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SwitchType=switch/none
MpiDefault=pmix
MailProg=/bin/true
ReturnToService=2
KillWait=20
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerParameters=sched_interval=1,bf_interval=1
NodeName=$host CPUs=$cpus State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP
CONF
  export SLURM_CONF="$SLURM_DIR/slurm.conf"
  slurmctld -f "$SLURM_CONF" && slurmd -f "$SLURM_CONF" || {
    tail -5 "$SLURM_DIR"/slurm*.log 2>/dev/null
    echo "skipped: Slurm cannot be started here: slurmctld or slurmd did not start"
    stop_slurm
    exit 77
  }
  local t state
  for t in $(seq 60); do
    state=$(sinfo --noheader --format=%t 2>/dev/null || true)
    [[ $state == idle ]] && { echo "slurm: $host idle ($cpus CPUs), SLURM_CONF=$SLURM_CONF"; return; }
    sleep 0.5
  done
  tail -5 "$SLURM_DIR"/slurm*.log 2>/dev/null
  echo "skipped: Slurm cannot be started here: node $host not idle after 30 s (state '$state')"
  stop_slurm
  exit 77
}

stop_slurm() {
  [[ -n "${SLURM_CONF:-}" && -f "$SLURM_DIR/slurmctld.pid" ]] || return 0
  local t pid
  scancel --user="$(id -un)" 2>/dev/null || true
  for t in $(seq 40); do
    [[ -z $(squeue --noheader 2>/dev/null) ]] && break
    sleep 0.5
  done
  scontrol shutdown 2>/dev/null || true
  for f in slurmctld slurmd munged; do
    pid=$(cat "$SLURM_DIR/$f.pid" 2>/dev/null || true)
    [[ -z $pid ]] && continue
    for t in $(seq 20); do kill -0 "$pid" 2>/dev/null || break; [[ $f == munged || $t -gt 10 ]] && kill "$pid" 2>/dev/null; sleep 0.5; done
  done
  rm -f "$SLURM_DIR/slurmctld.pid"
}
