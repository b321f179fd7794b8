#!/usr/bin/env bash
# Run one command on every worker of a Cloud TPU VM (a pod slice) at once.
#
#   ./launch_tpu.sh --tpu NAME --zone ZONE [--project P] [--repo DIR] [--setup] [--dry_run] \
#       -- --config configs/conformer.py:L --workdir gs://BUCKET/runs/conformer-l
#
# Every worker runs `python -m jaxspeech.train <args>` from DIR (default: ~/jaxspeech, a
# checkout already on each worker, e.g. copied with `gcloud compute tpus tpu-vm scp
# --worker=all`). No coordinator flags are needed: on a TPU VM
# `jaxspeech.parallel.mesh.initialize()` lets JAX detect the pod (worker count, this
# worker's index, the coordinator) from the TPU metadata. --setup first creates DIR/.venv
# and installs the package with the TPU build of jax (`pip install -e '.[tpu]'`) on every
# worker. --module runs another module (e.g. jaxspeech.evaluate). --dry_run prints the
# gcloud command instead of running it.
#
# Preemption: SIGTERM reaching the workers makes the run checkpoint at a step all hosts
# agree on and exit; rerunning the same command resumes. The workdir must be storage all
# workers share (a gs:// bucket or a mounted filesystem).
set -euo pipefail

usage() {
  sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//'
  exit 2
}

tpu="" zone="" project="" repo="~/jaxspeech" module="jaxspeech.train" setup=0 dry_run=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    --tpu) tpu="${2:?--tpu needs a value}"; shift 2 ;;
    --zone) zone="${2:?--zone needs a value}"; shift 2 ;;
    --project) project="${2:?--project needs a value}"; shift 2 ;;
    --repo) repo="${2:?--repo needs a value}"; shift 2 ;;
    --module) module="${2:?--module needs a value}"; shift 2 ;;
    --setup) setup=1; shift ;;
    --dry_run) dry_run=1; shift ;;
    -h|--help) usage ;;
    --) shift; break ;;
    *) echo "launch_tpu.sh: unknown option $1 (the run's own flags go after --)" >&2; exit 2 ;;
  esac
done
if [[ -z "$tpu" || -z "$zone" ]]; then
  echo "launch_tpu.sh: --tpu and --zone are required" >&2
  exit 2
fi
if [[ $# -eq 0 && "$module" == "jaxspeech.train" ]]; then
  echo "launch_tpu.sh: no arguments for jaxspeech.train after -- (at least --config and --workdir)" >&2
  exit 2
fi

# The remote command, with every argument quoted for the remote shell.
run_args=""
for a in "$@"; do run_args+=" $(printf '%q' "$a")"; done
remote="cd $repo"
if [[ $setup -eq 1 ]]; then
  remote+=" && python3 -m venv .venv && .venv/bin/pip install --quiet --upgrade pip"
  remote+=" && .venv/bin/pip install --quiet -e '.[tpu]'"
fi
remote+=" && .venv/bin/python -m $module$run_args"

cmd=(gcloud compute tpus tpu-vm ssh "$tpu" --zone "$zone" --worker=all --command "$remote")
if [[ -n "$project" ]]; then
  cmd+=(--project "$project")
fi
if [[ $dry_run -eq 1 ]]; then
  printf '%q ' "${cmd[@]}"
  echo
  exit 0
fi
if ! command -v gcloud >/dev/null 2>&1; then
  echo "launch_tpu.sh: gcloud not found; install the Google Cloud CLI (or use --dry_run)" >&2
  exit 2
fi
exec "${cmd[@]}"
