#!/usr/bin/env bash
# Run jaxspeech on a Cloud TPU VM slice (a pod) through the whole life of a run.
#
#   ./launch_tpu.sh --tpu NAME --zone ZONE [--project P] \
#       [--accelerator_type v5p-64 --runtime_version VERSION [--spot] [--queued]] \
#       [--sync] [--setup] [--max_restarts N] [--delete_when_done] [--dry_run] \
#       -- --config configs/conformer.py:L --workdir /mnt/runs/conformer-l
#   ./launch_tpu.sh --tpu NAME --zone ZONE [--project P] [--queued] --delete [--dry_run]
#
# Steps, each gcloud command printed before it runs (--dry_run prints them, runs none):
#  1. Create the slice if it does not exist: --accelerator_type and --runtime_version;
#     --spot for spot capacity; --queued through a queued resource of the same name
#     (waits until it is ACTIVE).
#  2. --sync: copy this checkout (tracked and untracked files, not ignored ones) to
#     ~/jaxspeech on every worker. --setup: create ~/jaxspeech/.venv there and install
#     the TPU build (pip install -e '.[tpu]').
#  3. Start `python -m jaxspeech.train ARGS` on every worker at once
#     (launch/tpu_worker.sh); worker 0's output is streamed here, every worker also
#     logs to ~/.jaxspeech/run.log. No coordinator flags: on a TPU VM
#     jaxspeech.parallel.mesh.initialize() lets JAX find the pod from its metadata.
#  4. When the command ends, ask worker 0 how the run stands (python -m
#     jaxspeech.status). Not finished: after a preemption (the slice is PREEMPTED or
#     gone: it is recreated, synced and set up again) or a maintenance event (the
#     command died on a slice that is still READY), start it again: the run resumes
#     from its checkpoint. A user error (exit 2) or divergence (exit 3) is not retried;
#     at most --max_restarts (20) restarts.
#  5. --delete_when_done: delete the slice once the run has finished.
# --module M runs another module once (e.g. jaxspeech.evaluate), without restarts;
# --until_finished restarts it like training (a training module of your own).
# --delete deletes the slice (and its queued resource) and exits.
#
# The workdir must be storage that every worker and every incarnation of the slice
# shares (a mounted bucket or filesystem): the checkpoints and RUN/events.jsonl live there.
set -euo pipefail

usage() {
  sed -n '2,34p' "$0" | sed 's/^# \{0,1\}//'
  exit 2
}

die() {
  echo "launch_tpu.sh: $*" >&2
  exit 2
}

tpu="" zone="" project="" accel="" runtime="" spot=0 queued=0 repo="jaxspeech"
module="jaxspeech.train" until_finished="" sync=0 setup=0 max_restarts=20 delete_when_done=0 delete=0
dry_run=0
poll_s="${LAUNCH_TPU_POLL_S:-30}"
while [[ $# -gt 0 ]]; do
  case "$1" in
    --tpu) tpu="${2:?--tpu needs a value}"; shift 2 ;;
    --zone) zone="${2:?--zone needs a value}"; shift 2 ;;
    --project) project="${2:?--project needs a value}"; shift 2 ;;
    --accelerator_type) accel="${2:?--accelerator_type needs a value}"; shift 2 ;;
    --runtime_version) runtime="${2:?--runtime_version needs a value}"; shift 2 ;;
    --spot) spot=1; shift ;;
    --queued) queued=1; shift ;;
    --repo) repo="${2:?--repo needs a value}"; shift 2 ;;
    --module) module="${2:?--module needs a value}"; shift 2 ;;
    --until_finished) until_finished=1; shift ;;
    --sync) sync=1; shift ;;
    --setup) setup=1; shift ;;
    --max_restarts) max_restarts="${2:?--max_restarts needs a value}"; shift 2 ;;
    --delete_when_done) delete_when_done=1; shift ;;
    --delete) delete=1; shift ;;
    --dry_run) dry_run=1; shift ;;
    -h|--help) usage ;;
    --) shift; break ;;
    *) die "unknown option $1 (the run's own flags go after --)" ;;
  esac
done
[[ -n "$tpu" && -n "$zone" ]] || die "--tpu and --zone are required"
[[ "$max_restarts" =~ ^[0-9]+$ ]] || die "--max_restarts must be a whole number, got $max_restarts"
if [[ -n "$accel" && -z "$runtime" ]] || [[ -z "$accel" && -n "$runtime" ]]; then
  die "--accelerator_type and --runtime_version go together (both create the slice)"
fi
if [[ -z "$until_finished" ]]; then
  until_finished=0
  [[ "$module" == "jaxspeech.train" ]] && until_finished=1
fi
if [[ $delete -eq 0 && $# -eq 0 && "$module" == "jaxspeech.train" ]]; then
  die "no arguments for jaxspeech.train after -- (at least --config and --workdir)"
fi

# The run directory, for asking whether the run has finished.
workdir=""
args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do
  case "${args[i]}" in
    --workdir=*) workdir="${args[i]#--workdir=}" ;;
    --workdir) workdir="${args[i + 1]:-}" ;;
  esac
done
if [[ $delete -eq 0 && $until_finished -eq 1 && -z "$workdir" ]]; then
  die "$module needs --workdir after -- (where the run resumes from)"
fi

where=(--zone "$zone")
if [[ -n "$project" ]]; then
  where+=(--project "$project")
fi

# Print a command, then run it (unless --dry_run).
step() {
  echo "+ $(printf '%q ' "$@")" >&2
  if [[ $dry_run -eq 0 ]]; then
    "$@"
  fi
}

remote() {  # remote WORKERS COMMAND: one command on the given workers (all, 0, ...)
  step gcloud compute tpus tpu-vm ssh "$tpu" "${where[@]}" --worker="$1" --command "$2"
}

slice_state() {  # READY, PREEMPTED, ...; empty when the slice does not exist
  gcloud compute tpus tpu-vm describe "$tpu" "${where[@]}" --format='value(state)' \
    2>/dev/null || true
}

create_slice() {
  [[ -n "$accel" ]] || die "slice $tpu does not exist in $zone; give --accelerator_type \
and --runtime_version to create it"
  local extra=()
  if [[ $spot -eq 1 ]]; then
    extra+=(--spot)
  fi
  if [[ $queued -eq 1 ]]; then
    step gcloud compute tpus queued-resources create "$tpu" --node-id "$tpu" "${where[@]}" \
      --accelerator-type "$accel" --runtime-version "$runtime" "${extra[@]}"
    [[ $dry_run -eq 1 ]] && return 0
    local qr_state=""
    while :; do
      qr_state="$(gcloud compute tpus queued-resources describe "$tpu" "${where[@]}" \
        --format='value(state.state)')"
      case "$qr_state" in
        ACTIVE) break ;;
        FAILED|SUSPENDED) die "queued resource $tpu is $qr_state" ;;
      esac
      echo "launch_tpu.sh: queued resource $tpu is $qr_state; waiting" >&2
      sleep "$poll_s"
    done
  else
    step gcloud compute tpus tpu-vm create "$tpu" "${where[@]}" \
      --accelerator-type "$accel" --version "$runtime" "${extra[@]}"
  fi
}

delete_slice() {
  if [[ $queued -eq 1 ]]; then
    step gcloud compute tpus queued-resources delete "$tpu" "${where[@]}" --force --quiet
  else
    step gcloud compute tpus tpu-vm delete "$tpu" "${where[@]}" --quiet
  fi
}

# Make the slice READY; prints "new" when it was (re)created, so the code must go there.
ensure_slice() {
  local state
  while :; do
    state="$(slice_state)"
    case "$state" in
      READY) return 0 ;;
      "") create_slice >&2; echo new; return 0 ;;
      CREATING|STARTING|RESTARTING|REPAIRING)
        echo "launch_tpu.sh: slice $tpu is $state; waiting" >&2
        sleep "$poll_s"
        ;;
      *)  # PREEMPTED, TERMINATED, STOPPED, ...: a spot slice does not come back by itself
        echo "launch_tpu.sh: slice $tpu is $state; recreating it" >&2
        delete_slice >&2
        create_slice >&2
        echo new
        return 0
        ;;
    esac
  done
}

sync_code() {
  local root tarball
  root="$(cd "$(dirname "$0")" && pwd)"
  tarball="$(mktemp "${TMPDIR:-/tmp}/jaxspeech-XXXXXX")"
  echo "+ (cd $root && git ls-files --cached --others --exclude-standard | tar -czf $tarball)" >&2
  if [[ $dry_run -eq 0 ]]; then
    (cd "$root" && git ls-files -z --cached --others --exclude-standard \
      | while IFS= read -r -d '' f; do [[ -e "$f" ]] && printf '%s\0' "$f"; done \
      | tar --null -T - -czf "$tarball")
  fi
  step gcloud compute tpus tpu-vm scp "$tarball" "$tpu:jaxspeech.tgz" "${where[@]}" --worker=all
  remote all "mkdir -p $repo && tar -xzf jaxspeech.tgz -C $repo && rm jaxspeech.tgz"
  rm -f "$tarball"
}

install_code() {
  remote all "cd $repo && python3 -m venv .venv && .venv/bin/pip install --quiet --upgrade pip \
&& .venv/bin/pip install --quiet -e '.[tpu]'"
}

if [[ $delete -eq 1 ]]; then
  delete_slice
  exit 0
fi

quoted=""
for a in "$@"; do quoted+=" $(printf '%q' "$a")"; done
run_cmd="cd $repo && bash launch/tpu_worker.sh run $module$quoted"
status_cmd="cd $repo && bash launch/tpu_worker.sh status $(printf '%q' "$workdir")"

if [[ $dry_run -eq 1 ]]; then
  echo "# if $tpu does not exist (or was preempted):" >&2
  create_slice
  [[ $sync -eq 1 ]] && sync_code
  [[ $setup -eq 1 ]] && install_code
  remote all "$run_cmd"
  if [[ $until_finished -eq 1 ]]; then
    echo "# then, until the run has finished (restarting after a preemption):" >&2
    remote 0 "$status_cmd"
  fi
  [[ $delete_when_done -eq 1 ]] && delete_slice
  exit 0
fi
command -v gcloud >/dev/null 2>&1 \
  || die "gcloud not found; install the Google Cloud CLI (or use --dry_run)"

restarts=0
first=1
while :; do
  fresh="$(ensure_slice)"
  if [[ "$fresh" == "new" || ($first -eq 1 && $sync -eq 1) ]]; then
    sync_code
  fi
  if [[ "$fresh" == "new" || ($first -eq 1 && $setup -eq 1) ]]; then
    install_code
  fi
  first=0
  rc=0
  remote all "$run_cmd" || rc=$?
  if [[ $until_finished -eq 0 ]]; then
    exit "$rc"
  fi
  state="$(slice_state)"
  if [[ "$state" == "READY" ]]; then
    status="$(remote 0 "$status_cmd" || true)"
    echo "launch_tpu.sh: worker 0: $(echo "$status" | tr '\n' ' ')" >&2
    if grep -q '^state=finished' <<<"$status"; then
      break
    fi
    code="$(sed -n 's/^exit_code=//p' <<<"$status")"
    if [[ "$code" == "2" || "$code" == "3" || "$code" == "5" ]]; then
      echo "launch_tpu.sh: the run exited with code $code (2: a user error, 3: diverged," \
        "5: storage full or unwritable); not restarting it" >&2
      exit "$code"
    fi
  else
    echo "launch_tpu.sh: the command ended with code $rc and slice $tpu is" \
      "${state:-gone}" >&2
  fi
  if [[ $restarts -ge $max_restarts ]]; then
    echo "launch_tpu.sh: the run has not finished after $restarts restarts; giving up" >&2
    exit 1
  fi
  restarts=$((restarts + 1))
  echo "launch_tpu.sh: the run has not finished; restart $restarts of $max_restarts" >&2
done
echo "launch_tpu.sh: the run has finished" >&2
if [[ $delete_when_done -eq 1 ]]; then
  delete_slice
fi
