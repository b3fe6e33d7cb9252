#!/usr/bin/env bash
# A single-node Slurm cluster on this machine (Debian bookworm, as root, loopback only), so
# that integration tests can submit real `sbatch --array` jobs.
#   bash scripts/slurm_local.sh start    # install if needed, configure, start; idempotent
#   bash scripts/slurm_local.sh stop     # cancel jobs, stop the daemons (packages stay)
#   bash scripts/slurm_local.sh status   # the node's sinfo line; exit 0 if up, 1 if not
# Accounting (slurmdbd on a local MariaDB, unix socket only) is on by default: without it
# `sacct` fails ("accounting storage is disabled") and submitit, which polls sacct, waits
# forever on a cancelled task. SLURM_LOCAL_ACCOUNTING=0 leaves MariaDB and slurmdbd out.
set -euo pipefail

CONF=/etc/slurm/slurm.conf DBD_CONF=/etc/slurm/slurmdbd.conf
MARK="# Written by fedjax_pals scripts/slurm_local.sh; it rewrites this file on start."
RUN=/run/slurm-local            # our pid files; munged and MariaDB keep Debian's (below)
MUNGE_PID=/run/munge/munged.pid DB_PID=/run/mysqld/mysqld.pid
SPOOL=/var/spool/slurm-local LOGS=/var/log/slurm-local
ACCT=${SLURM_LOCAL_ACCOUNTING:-1} READY_S=${SLURM_LOCAL_READY_S:-60}
NODE=$(hostname -s)

die() {  # one clear line, then the end of the log that explains it
  echo "error: $1" >&2
  [ -f "${2:-}" ] && { echo "--- tail of $2:" >&2; tail -n 20 "$2" >&2; }
  exit 1
}
# A daemon that exited stays a zombie until PID 1 reaps it (here, every second or so).
running() { [[ "$(ps -o stat= -p "$1" 2>/dev/null)" == [!Z]* ]]; }
alive() { [ -f "$1" ] && running "$(cat "$1")"; }  # $1 = pid file
ours() { [ ! -f "$1" ] || head -n1 "$1" | grep -qxF "$MARK"; }  # absent, or written by us
node_state() { timeout 10 sinfo -h -n "$NODE" -o %T 2>/dev/null | head -n1; }
is_up() { case "$(node_state)" in idle|mixed|allocated|completing) return 0 ;; esac; return 1; }

install_packages() {
  local pkgs=(slurm-wlm munge) missing=() p log=/tmp/slurm_local_apt.log
  [ "$ACCT" = 1 ] && pkgs+=(slurmdbd mariadb-server)
  for p in "${pkgs[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
  (( ${#missing[@]} )) || return 0
  [ "$(id -u)" = 0 ] || die "needs root to install ${missing[*]} (apt-get install ${missing[*]})"
  echo "[slurm] installing ${missing[*]} (apt-get)"
  local apt=(env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends
             -o Dpkg::Use-Pty=0 "${missing[@]}")
  "${apt[@]}" >$log 2>&1 || { apt-get update -qq >>$log 2>&1 && "${apt[@]}" >>$log 2>&1; } \
    || die "apt-get install ${missing[*]} failed" $log
}

write_config() {
  ours "$CONF" || { echo "[slurm] note: $CONF is not ours (no header); using it as it is"; return 0; }
  local cpus acct=none; cpus=$(nproc); [ "$ACCT" = 1 ] && acct=slurmdbd
  # RealMemory at 90% of the machine's (slurmd must find at least that much), and a default
  # per CPU: with CR_Core_Memory and no default, a job without --mem gets the whole node's
  # memory, and jobs run one at a time.
  local mem=$(( $(awk '/^MemTotal:/ {print $2}' /proc/meminfo) / 1024 * 9 / 10 ))
  mkdir -p /etc/slurm
  cat >"$CONF.tmp" <<EOT
$MARK
ClusterName=local
SlurmctldHost=$NODE(127.0.0.1)
SlurmUser=root
AuthType=auth/munge
# A requeued job waits cred_expire+1 s before it may start again (default 120 s).
AuthInfo=cred_expire=10
# No cgroups in a container: track processes by parent id, no task binding.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/$acct
AccountingStorageHost=localhost
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU=$(( mem / cpus ))
# A restarted node comes back by itself; its resources are the ones written here.
ReturnToService=2
SlurmdParameters=config_overrides
# Short timers: jobs start, and cancelled jobs end, within seconds.
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=2,bf_interval=1,batch_sched_delay=0
MessageTimeout=10
KillWait=5
# Finished jobs stay visible to squeue/scontrol for 10 min.
MinJobAge=600
MaxArraySize=100001
MaxJobCount=200000
MailProg=/bin/true
StateSaveLocation=$SPOOL/ctld
SlurmdSpoolDir=$SPOOL/d
SlurmctldPidFile=$RUN/slurmctld.pid
SlurmdPidFile=$RUN/slurmd.pid
SlurmctldLogFile=$LOGS/slurmctld.log
SlurmdLogFile=$LOGS/slurmd.log
NodeName=$NODE NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$mem State=UNKNOWN
PartitionName=local Nodes=$NODE Default=YES MaxTime=INFINITE State=UP
EOT
  cmp -s "$CONF.tmp" "$CONF" && { rm -f "$CONF.tmp"; return 0; }
  mv "$CONF.tmp" "$CONF"
  alive "$RUN/slurmctld.pid" && echo "[slurm] note: $CONF changed; run stop, then start, to apply it"
  return 0
}

start_munge() {
  alive "$MUNGE_PID" && return 0
  getent passwd munge >/dev/null || die "user munge is missing (reinstall the munge package)"
  mkdir -p /etc/munge /run/munge /var/lib/munge /var/log/munge
  chown munge:munge /run/munge /var/lib/munge /var/log/munge
  # The munge package makes a key on install; make one if it is gone.
  [ -s /etc/munge/munge.key ] || dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
  chown munge:munge /etc/munge/munge.key && chmod 0400 /etc/munge/munge.key
  runuser -u munge -- /usr/sbin/munged || die "munged did not start" /var/log/munge/munged.log
  for _ in $(seq 50); do alive "$MUNGE_PID" && munge -n >/dev/null 2>&1 && return 0; sleep 0.1; done
  die "munged is not answering" /var/log/munge/munged.log
}

start_daemon() {  # $1 = slurmdbd | slurmctld | slurmd; each forks and writes its pid file
  alive "$RUN/$1.pid" && return 0
  "/usr/sbin/$1" >>"$LOGS/$1.log" 2>&1 || die "$1 did not start" "$LOGS/$1.log"
}

start_accounting() {  # MariaDB (Debian's datadir, no TCP; root over the socket), slurmdbd
  if ! alive "$DB_PID"; then  # 'stop' stops MariaDB only if this started it
    mkdir -p /run/mysqld && chown mysql:mysql /run/mysqld
    [ -d /var/lib/mysql/mysql ] || mariadb-install-db --user=mysql >>"$LOGS/mariadb.log" 2>&1
    setsid -f /usr/sbin/mariadbd --user=mysql --skip-networking --log-error="$LOGS/mariadb.log" \
      </dev/null >/dev/null 2>&1
    touch "$RUN/mariadb.ours"
  fi
  for _ in $(seq 300); do mariadb-admin ping >/dev/null 2>&1 && break; sleep 0.1; done
  mariadb-admin ping >/dev/null 2>&1 || die "MariaDB is not answering" "$LOGS/mariadb.log"
  if ours "$DBD_CONF"; then
    printf '%s\n' "$MARK" AuthType=auth/munge DbdHost=localhost DbdAddr=127.0.0.1 SlurmUser=root \
      "PidFile=$RUN/slurmdbd.pid" "LogFile=$LOGS/slurmdbd.log" StorageType=accounting_storage/mysql \
      StorageHost=localhost StorageUser=root StorageLoc=slurm_acct_db >"$DBD_CONF"
    chmod 600 "$DBD_CONF"  # slurmdbd refuses a file that others can read (it may hold a password)
  fi
  start_daemon slurmdbd
  for _ in $(seq 100); do timeout 5 sacctmgr -n list cluster >/dev/null 2>&1 && return 0; sleep 0.2; done
  die "slurmdbd is not answering" "$LOGS/slurmdbd.log"
}

start() {
  install_packages
  mkdir -p "$RUN" "$SPOOL/ctld" "$SPOOL/d" "$LOGS"
  write_config
  start_munge
  [ "$ACCT" = 1 ] && start_accounting  # before slurmctld, which registers the cluster there
  start_daemon slurmctld
  start_daemon slurmd
  local state="" t0=$SECONDS resumed=0
  while (( SECONDS - t0 < READY_S )); do
    is_up && { echo "[slurm] up: $(sinfo -h -o '%P %a %D %T %N' | head -n1)"; return 0; }
    state=$(node_state)
    # A node left drained or down in the saved state (e.g. after a kill) is resumed once.
    if [[ "$state" == drain* || "$state" == down* ]] && (( ! resumed )); then
      scontrol update NodeName="$NODE" State=RESUME >/dev/null 2>&1 || true; resumed=1
    fi
    alive "$RUN/slurmctld.pid" || die "slurmctld exited" "$LOGS/slurmctld.log"
    alive "$RUN/slurmd.pid" || die "slurmd exited" "$LOGS/slurmd.log"
    sleep 0.5
  done
  die "node $NODE not idle after ${READY_S}s (state: '${state:-no answer}')" "$LOGS/slurmctld.log"
}

stop_pids() {  # pid files: SIGTERM to all, wait up to 30 s for all, then SIGKILL
  local f pids=() pid
  for f in "$@"; do alive "$f" && pids+=("$(cat "$f")") && kill "${pids[-1]}"; rm -f "$f"; done
  for _ in $(seq 300); do
    local left=0; for pid in "${pids[@]}"; do running "$pid" && left=1; done
    (( left )) || return 0; sleep 0.1
  done
  echo "[slurm] warning: ${pids[*]} ($*) ignored SIGTERM for 30 s; killing" >&2
  kill -9 "${pids[@]}" 2>/dev/null || true
}

stop() {
  # Cancel queued and running jobs first: job steps would outlive slurmd.
  if alive "$RUN/slurmctld.pid"; then
    mapfile -t ids < <(timeout 10 squeue -h -o %A 2>/dev/null || true)
    (( ${#ids[@]} )) && { scancel "${ids[@]}" 2>/dev/null || true; }
    for _ in $(seq 30); do [ -z "$(timeout 10 squeue -h -o %A 2>/dev/null)" ] && break; sleep 0.5; done
  fi
  # slurmctld sends its last records to slurmdbd: slurmdbd, then MariaDB and munged, after it.
  stop_pids "$RUN/slurmd.pid" "$RUN/slurmctld.pid"
  stop_pids "$RUN/slurmdbd.pid"
  local db=(); [ -f "$RUN/mariadb.ours" ] && db=("$DB_PID") && rm -f "$RUN/mariadb.ours"
  stop_pids "${db[@]}" "$MUNGE_PID"
  echo "[slurm] stopped"
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  status)
    if command -v sinfo >/dev/null && alive "$RUN/slurmctld.pid" && is_up; then
      sinfo -h -o '%P %a %D %T %N' | head -n1; exit 0
    fi
    echo "down"; exit 1 ;;
  *) echo "usage: $0 start|stop|status" >&2; exit 2 ;;
esac
