#!/usr/bin/env bash
# Jobs that outlive the ssh session that started them, kept in .plscale/jobs/ of the current folder.
# `plscale runpod run` and `plscale runpod logs` call it over ssh, in the project folder on a pod:
#   job.sh start NAME -- CMD [ARGS...]  run CMD detached (its own session); prints its pid
#   job.sh follow NAME                  the log from its first line until the job ends; exits with its code
#   job.sh stop NAME                    TERM the job's process group, KILL it 10 s later if still alive
#                                       (PLSCALE_JOB_GRACE=seconds changes the 10)
#   job.sh tail NAME [N]                the log's last N lines (50)
#   job.sh status NAME                  "running" or "exited RC"
#   job.sh latest                       the NAME of the job started last
# Files: NAME.log (stdout and stderr), NAME.pid (a process-group leader), NAME.rc (exit code, once ended).
set -euo pipefail
dir=.plscale/jobs
usage="bash runpod/job.sh start NAME -- CMD... | follow NAME | stop NAME | tail NAME [N] | status NAME | latest"
die() { echo "job.sh: $*" >&2; exit 2; }

job() {  # NAME: check it, set $name and $base
  [[ ${1:-} =~ ^[A-Za-z0-9][A-Za-z0-9._-]*$ ]] || die "job name '${1:-}': use letters, digits, '.', '_', '-' ($usage)"
  name=$1 base=$dir/$1
}
known() {  # set $pid of a job that was started
  [[ -s $base.pid ]] || die "no job $name in $PWD/$dir (bash runpod/job.sh latest names the newest)"
  pid=$(<"$base.pid")
}
# Liveness from /proc, where a zombie (ended, not yet reaped: a pod's PID 1 may reap late or never)
# counts as ended, as kill -0 would not.
state() { local line; read -r line 2>/dev/null < "/proc/$1/stat" || return 1; fields=(${line##*) }); }
running() { [[ ! -f $base.rc ]] && state "$pid" && [[ ${fields[0]} != Z ]]; }  # the leader writes NAME.rc last
group_alive() {  # a live process is left in the job's process group
  local file
  for file in /proc/[0-9]*; do
    if state "${file#/proc/}" && [[ ${fields[2]:-} == "$pid" && ${fields[0]} != Z ]]; then return 0; fi
  done
  return 1
}

case ${1:-} in
start)
  job "${2:-}"
  [[ ${3:-} == -- && $# -ge 4 ]] || die "start needs a command: bash runpod/job.sh start NAME -- CMD [ARGS...]"
  shift 3
  mkdir -p "$dir"
  if [[ -s $base.pid ]]; then
    pid=$(<"$base.pid")
    if running; then die "job $name is running (pid $pid): bash runpod/job.sh stop $name first, or use another name"; fi
  fi
  rm -f "$base.pid" "$base.rc"
  # The leader (setsid: a new session and process group) writes its own pid, runs CMD and records
  # its exit code; it traps TERM and INT to outlive CMD (CMD gets them at their defaults, as a trap,
  # unlike an ignored signal, is not inherited); nohup leaves HUP ignored, for CMD too.
  setsid nohup bash -c 'trap : TERM INT HUP; echo $$ > "$0.pid"; "$@"; rc=$?
                        echo $rc > "$0.rc.tmp" && mv -f "$0.rc.tmp" "$0.rc"' "$base" "$@" \
    < /dev/null > "$base.log" 2>&1 &
  for _ in $(seq 200); do [[ -s $base.pid ]] && break; sleep 0.05; done
  [[ -s $base.pid ]] || die "job $name did not start within 10 s: see $PWD/$base.log"
  cat "$base.pid" ;;
follow)
  job "${2:-}"; known
  if running; then  # tail ends with the watcher, a child of this shell, which ends with the job
    ( while running; do sleep 0.5; done ) &
    watcher=$!; trap 'kill "$watcher" 2> /dev/null' EXIT  # also when ssh drops and this ends
    tail -n +1 -F -s 0.5 --pid="$watcher" "$base.log"
    trap - EXIT
  else cat "$base.log"; fi
  [[ -f $base.rc ]] || { echo "job.sh: job $name ended without recording its exit code (killed?)" >&2; exit 1; }
  exit "$(<"$base.rc")" ;;
stop)
  job "${2:-}"; known
  if group_alive; then
    kill -TERM -- "-$pid" 2>/dev/null || true; signal=143
    for _ in $(seq "$((${PLSCALE_JOB_GRACE:-10} * 10))"); do group_alive || break; sleep 0.1; done
    if group_alive; then kill -KILL -- "-$pid" 2>/dev/null || true; signal=137; fi
    for _ in $(seq 50); do group_alive || break; sleep 0.1; done
    [[ -f $base.rc ]] || echo "$signal" > "$base.rc"  # the leader was killed before writing it
  fi ;;
tail)
  job "${2:-}"; known
  [[ ${3:-50} =~ ^[0-9]+$ ]] || die "tail $name ${3}: N is a number of lines"
  tail -n "${3:-50}" "$base.log" ;;
status)
  job "${2:-}"; known
  if running; then echo running
  elif [[ -f $base.rc ]]; then echo "exited $(<"$base.rc")"
  else echo "job.sh: job $name ended without recording its exit code (killed?)" >&2; echo "exited 1"
  fi ;;
latest)
  newest=
  for file in "$dir"/*.pid; do
    if [[ -e $file && ( -z $newest || $file -nt $newest ) ]]; then newest=$file; fi
  done
  [[ -n $newest ]] || die "no job in $PWD/$dir yet: start one with plscale runpod run LAB"
  basename "$newest" .pid ;;
*) die "usage: $usage" ;;
esac
