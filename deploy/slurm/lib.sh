# shellcheck shell=bash
# Settings and helpers shared by `up` and `down` (sourced, never run).
#
# Every setting is an environment variable with a safe default; `up` writes the values it used into
# $JOBGATE_SLURM_DIR/settings so that `down` (and a second `up`) act on the same cluster.

E=${JOBGATE_SLURM_DIR:-/tmp/jobgate-slurm}
E=${E%/}
case $E in /*) ;; *) E=$PWD/$E ;; esac

log() { printf '[slurm-%s %(%H:%M:%S)T] %s\n' "${SCRIPT:-starter}" -1 "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

# alive PIDFILE PATTERN: the pid in PIDFILE runs and its command line contains PATTERN. A pid file
# whose process is gone (or whose pid was reused by something else) is never taken for ours.
alive() {
  local f=$1 pat=$2 p
  [[ -s $f ]] || return 1
  p=$(<"$f")
  [[ $p =~ ^[0-9]+$ && -r /proc/$p/cmdline ]] || return 1
  tr '\0' ' ' <"/proc/$p/cmdline" 2>/dev/null | grep -qF -- "$pat"
}

# wait_for SECONDS CMD...: run CMD every 0.2 s until it succeeds; false after SECONDS.
wait_for() {
  local t=$1 k
  shift
  for ((k = 0; k < t * 5; k++)); do
    "$@" >/dev/null 2>&1 && return 0
    sleep 0.2
  done
  return 1
}

# ours: the pids of processes this cluster's slurmds started (job scripts, their children, slurmstepds)
# that are still alive. A process is ours when it carries the marker JOBGATE_SLURM_MARK=$E in its
# environment: slurmstepd inherits it from the slurmd `up` started with it, and every task gets it from
# the TaskProlog `up` installs. Nothing else on the machine has that exact value.
ours() {
  local f p
  # One grep over every environment (-z: NUL-separated entries, -x: the whole entry); not this shell.
  for f in $(grep -lzxF -- "JOBGATE_SLURM_MARK=$E" /proc/[0-9]*/environ 2>/dev/null); do
    p=${f#/proc/}; p=${p%/environ}
    [[ $p == "$$" || $p == "${BASHPID:-}" ]] || echo "$p"
  done
  return 0
}

# mysql_admin ARGS...: the MariaDB client as the server's administrator, over TCP on loopback.
mysql_admin() {
  mariadb --protocol=tcp -h 127.0.0.1 -P "$MYSQL_PORT" -u "$MYSQL_ADMIN_USER" "$@"
}
