#!/usr/bin/env bash
# What every worker of a TPU slice runs for launch_tpu.sh, from its copy of the checkout.
#
#   bash launch/tpu_worker.sh run MODULE [ARGS...]
#       Runs `.venv/bin/python -m MODULE ARGS` and records its exit code. Worker 0 prints
#       its output (the launcher streams it); every worker appends to ~/.jaxspeech/run.log.
#       A process of an earlier attempt still running (the launcher lost its connection)
#       gets SIGTERM first, so it checkpoints and leaves the accelerators free.
#   bash launch/tpu_worker.sh status WORKDIR
#       Prints `exit_code=<last run's code>` and the run's state (python -m
#       jaxspeech.status); exits 0 when the run has finished.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
state_dir="${HOME}/.jaxspeech"
mkdir -p "$state_dir"

worker_index() {
  # TPU_WORKER_ID where set; else the TPU VM's metadata; else the hostname's -w-N suffix.
  if [[ -n "${TPU_WORKER_ID:-}" ]]; then
    echo "$TPU_WORKER_ID"
    return
  fi
  curl -sf -H 'Metadata-Flavor: Google' \
    http://metadata.google.internal/computeMetadata/v1/instance/attributes/agent-worker-number \
    || hostname | sed -n 's/.*-w-\([0-9][0-9]*\)$/\1/p'
}

stop_leftovers() {
  local module="$1" pattern=".venv/bin/python -m $1"
  pkill -TERM -f -- "$pattern" || return 0
  for _ in $(seq 60); do
    pgrep -f -- "$pattern" >/dev/null || return 0
    sleep 1
  done
  echo "tpu_worker.sh: an earlier $module did not stop in 60 s; killing it" >&2
  pkill -KILL -f -- "$pattern" || true
}

case "${1:-}" in
  run)
    module="${2:?usage: tpu_worker.sh run MODULE [ARGS...]}"
    shift 2
    stop_leftovers "$module"
    log="$state_dir/run.log"
    echo "=== $(date -u +%FT%TZ) python -m $module $*" >>"$log"
    if [[ "$(worker_index)" == "0" ]]; then
      .venv/bin/python -m "$module" "$@" 2>&1 | tee -a "$log"
      rc=${PIPESTATUS[0]}
    else
      .venv/bin/python -m "$module" "$@" >>"$log" 2>&1
      rc=$?
    fi
    echo "$rc" >"$state_dir/exit_code"
    exit "$rc"
    ;;
  status)
    workdir="${2:?usage: tpu_worker.sh status WORKDIR}"
    echo "exit_code=$(cat "$state_dir/exit_code" 2>/dev/null || echo none)"
    exec .venv/bin/python -m jaxspeech.status "$workdir"
    ;;
  *)
    echo "usage: tpu_worker.sh run MODULE [ARGS...] | status WORKDIR" >&2
    exit 2
    ;;
esac
