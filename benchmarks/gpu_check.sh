#!/usr/bin/env bash
# The train step on a GPU for this tree and a baseline tree in one call, within a device-time
# budget (default 330 s, under the 6 minutes a GPU check may take): benchmarks/train_step.py
# for Conformer-L and -S at 64 x 16 s, bf16, with the PyTorch peer beside this tree's rows
# (when its train_step.py has --peer). Results are JSON files named by the device.
#
# Here (a checkout with git and a package registry), before borrowing the GPU:
#   make gpu-check-wheels                      # cp312 wheels the GPU image lacks, .gpu-check/wheels
#   benchmarks/gpu_check.sh --prepare [--baseline COMMIT]
#       # `git archive` of COMMIT (default HEAD~1) into .gpu-check/baseline (read only for git)
# On the GPU machine (carry .gpu-check; it cannot reach a registry and may have no .git):
#   benchmarks/gpu_check.sh [--baseline COMMIT|DIR] [--models L,S] [--budget SECONDS]
#                           [--out DIR] [--python PYTHON] [--dry-run]
#   The wheels are installed with pip --target into a temporary directory and put on
#   PYTHONPATH after the tree. The baseline is DIR, else COMMIT extracted with git archive
#   when .git is there, else the prepared .gpu-check/baseline. Runs, most important first:
#   this tree's L (with the peer), the baseline's L, this tree's S (with the peer), the
#   baseline's S; a run that would start with under MIN_RUN_S of the budget left is skipped
#   and each run is killed when the budget ends (both recorded). Writes, under --out
#   (default $OUT if set, else benchmarks/results):
#     train_step_<device>_<tree>_<model>.json   (benchmarks/train_step.py's own result)
#     train_step_<device>_<tree>_<model>.log    (its output)
#     gpu_check_<device>.json                   (the runs, their status and their rows)
#   --dry-run: prepares the trees and prints the runs without running them (no GPU needed).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CHECK_DIR="${GPU_CHECK_DIR:-$ROOT/.gpu-check}"  # the carried wheels (and a prepared baseline)
BASELINE=""
MODELS="L,S"
BUDGET_S=330
MIN_RUN_S=45
OUT_DIR="${OUT:-$ROOT/benchmarks/results}"
PY="${PYTHON:-python3}"
PREPARE=0
DRY_RUN=0

die() { echo "gpu_check.sh: $*" >&2; exit 2; }

while [ $# -gt 0 ]; do
  case "$1" in
    --prepare) PREPARE=1 ;;
    --dry-run) DRY_RUN=1 ;;
    --baseline) [ $# -ge 2 ] || die "--baseline needs a commit or a directory"; BASELINE="$2"; shift ;;
    --models) [ $# -ge 2 ] || die "--models needs a list such as L,S"; MODELS="$2"; shift ;;
    --budget) [ $# -ge 2 ] || die "--budget needs seconds"; BUDGET_S="$2"; shift ;;
    --out) [ $# -ge 2 ] || die "--out needs a directory"; OUT_DIR="$2"; shift ;;
    --python) [ $# -ge 2 ] || die "--python needs an interpreter"; PY="$2"; shift ;;
    -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "${BASH_SOURCE[0]}"; exit 0 ;;
    *) die "unknown argument '$1' (see --help)" ;;
  esac
  shift
done
[[ "$BUDGET_S" =~ ^[0-9]+$ ]] || die "--budget must be whole seconds, got '$BUDGET_S'"
[[ "$MODELS" =~ ^[A-Za-z]+(,[A-Za-z]+)*$ ]] || die "--models must be sizes such as L,S, got '$MODELS'"

# `git archive` of commit $1 of this checkout into directory $2 (no worktree, no checkout:
# the repository is only read). Prints the commit's short hash.
extract_commit() {
  local commit="$1" into="$2" short
  git -C "$ROOT" rev-parse --git-dir >/dev/null 2>&1 || die "no git repository at $ROOT to extract '$commit' from"
  short=$(git -C "$ROOT" rev-parse --short "$commit^{commit}" 2>/dev/null) || die "no commit '$commit'"
  rm -rf "$into" && mkdir -p "$into"
  git -C "$ROOT" archive "$short" | tar -x -C "$into"
  echo "$short" > "$into/.gpu-check-commit"
  echo "$short"
}

if [ "$PREPARE" = 1 ]; then
  short=$(extract_commit "${BASELINE:-HEAD~1}" "$CHECK_DIR/baseline")
  echo "baseline ${BASELINE:-HEAD~1} ($short) extracted into $CHECK_DIR/baseline"
  if ! ls "$CHECK_DIR"/wheels/*.whl >/dev/null 2>&1; then
    echo "gpu_check.sh: no wheels in $CHECK_DIR/wheels yet: run make gpu-check-wheels" >&2
  fi
  echo "carry .gpu-check to the GPU machine and run benchmarks/gpu_check.sh there"
  exit 0
fi

# ---------------------------------------------------------------- the baseline tree
TMP=$(mktemp -d "${TMPDIR:-/tmp}/gpu_check.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
if [ -n "$BASELINE" ] && [ -d "$BASELINE" ]; then
  BASE_TREE=$(cd "$BASELINE" && pwd)
  BASE_LABEL="dir:$BASE_TREE"
elif [ -n "$BASELINE" ]; then
  BASE_TREE="$TMP/baseline"
  BASE_LABEL=$(extract_commit "$BASELINE" "$BASE_TREE")
elif [ -d "$CHECK_DIR/baseline/jaxspeech" ]; then
  BASE_TREE="$CHECK_DIR/baseline"
  BASE_LABEL=$(cat "$BASE_TREE/.gpu-check-commit" 2>/dev/null || echo prepared)
elif git -C "$ROOT" rev-parse --git-dir >/dev/null 2>&1; then
  BASE_TREE="$TMP/baseline"
  BASE_LABEL=$(extract_commit HEAD~1 "$BASE_TREE")
else
  die "no baseline: pass --baseline DIR, or run --prepare where git is (see --help)"
fi
[ -f "$BASE_TREE/benchmarks/train_step.py" ] || die "the baseline $BASE_LABEL has no benchmarks/train_step.py"

# ---------------------------------------------------------------- the wheels
SITE="$TMP/site"
install_wheels() {
  local wheels=("$CHECK_DIR"/wheels/*.whl)
  [ -e "${wheels[0]}" ] || { echo "no carried wheels in $CHECK_DIR/wheels: using the image's packages only" >&2; return 0; }
  mkdir -p "$SITE"
  if ! "$PY" -m pip install --quiet --no-deps --no-index --target "$SITE" "${wheels[@]}" 2>"$TMP/pip.err"; then
    # No pip: a wheel is a zip of what goes into site-packages.
    echo "pip failed ($(tail -n1 "$TMP/pip.err")); unpacking the wheels directly" >&2
    "$PY" - "$SITE" "${wheels[@]}" <<'EOF'
import sys, zipfile
for w in sys.argv[2:]:
    zipfile.ZipFile(w).extractall(sys.argv[1])
EOF
  fi
}

# ---------------------------------------------------------------- the runs
slug() { tr '[:upper:]' '[:lower:]' | sed -E 's/[^a-z0-9]+/-/g; s/^-+|-+$//g'; }
DEVICE=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n1 || true)
DEVICE_SLUG=$(printf '%s' "${DEVICE:-unknown-gpu}" | slug)
mkdir -p "$OUT_DIR"
RUNS_TSV="$TMP/runs.tsv"
: > "$RUNS_TSV"

has_peer() { grep -q -- "--peer" "$1/benchmarks/train_step.py"; }

# The command of one run: tree label, tree dir, model.
run_command() {
  local label="$1" tree="$2" model="$3"
  local out="$OUT_DIR/train_step_${DEVICE_SLUG}_${label}_${model}.json"
  local peer=""
  # The peer is the same PyTorch model whatever our tree: timed once, beside this tree's.
  if [ "$label" = current ] && has_peer "$tree"; then peer="--peer"; fi
  printf '%s\n' "cd $tree && PYTHONPATH=$tree:$SITE $PY benchmarks/train_step.py --models $model $peer --out $out"
}

PLAN=()
IFS=',' read -r -a MODEL_LIST <<< "$MODELS"
for model in "${MODEL_LIST[@]}"; do
  model=$(printf '%s' "$model" | tr '[:lower:]' '[:upper:]')
  PLAN+=("current|$ROOT|$model" "baseline|$BASE_TREE|$model")
done

echo "gpu_check: device '${DEVICE:-none found}', baseline $BASE_LABEL, models $MODELS, budget ${BUDGET_S} s"
if [ "$DRY_RUN" = 1 ]; then
  for item in "${PLAN[@]}"; do
    IFS='|' read -r label tree model <<< "$item"
    echo "would run: $(run_command "$label" "$tree" "$model")"
  done
  exit 0
fi

START=$(date +%s)
install_wheels
for tree in "$ROOT" "$BASE_TREE"; do
  if ! (cd "$tree" && PYTHONPATH="$tree:$SITE" "$PY" -c "import jaxspeech.training.step, configs.conformer" 2>"$TMP/import.err"); then
    die "cannot import jaxspeech from $tree: $(tail -n1 "$TMP/import.err")"
  fi
done

for item in "${PLAN[@]}"; do
  IFS='|' read -r label tree model <<< "$item"
  left=$(( BUDGET_S - ($(date +%s) - START) ))
  out="$OUT_DIR/train_step_${DEVICE_SLUG}_${label}_${model}.json"
  if [ "$left" -lt "$MIN_RUN_S" ]; then
    echo "skipped $label $model: ${left} s of the budget left"
    printf '%s\t%s\t%s\t%s\t%s\n' "$label" "$model" "skipped" 0 "$out" >> "$RUNS_TSV"
    continue
  fi
  echo "== $label $model (budget left ${left} s)"
  cmd=$(run_command "$label" "$tree" "$model")
  log="${out%.json}.log"
  t0=$(date +%s)
  rc=0
  # timeout signals its whole process group: train_step.py's worker processes too.
  timeout --kill-after=10 "$left" bash -c "$cmd" > "$log" 2>&1 || rc=$?
  tail -n 20 "$log"
  case "$rc" in
    0) status=ok ;;
    124|137) status=timeout ;;
    *) status="failed:$rc" ;;
  esac
  printf '%s\t%s\t%s\t%s\t%s\n' "$label" "$model" "$status" "$(( $(date +%s) - t0 ))" "$out" >> "$RUNS_TSV"
done

SUMMARY="$OUT_DIR/gpu_check_${DEVICE_SLUG}.json"
"$PY" - "$RUNS_TSV" "$SUMMARY" "${DEVICE:-}" "$BASE_LABEL" "$(( $(date +%s) - START ))" <<'EOF'
import json, os, sys
runs_tsv, summary, device, baseline, wall = sys.argv[1:6]
runs, rows = [], []
for line in open(runs_tsv):
    label, model, status, seconds, path = line.rstrip("\n").split("\t")
    runs.append({"tree": label, "model": model, "status": status, "seconds": int(seconds),
                 "file": os.path.basename(path)})
    if status == "ok" and os.path.exists(path):
        rows += [{"tree": label, **r} for r in json.load(open(path)).get("rows", [])]
json.dump({"benchmark": "gpu_check", "device": device, "baseline": baseline,
           "wall_s": int(wall), "runs": runs, "rows": rows}, open(summary, "w"), indent=1)
print(f"{'tree':9} {'model':12} {'step ms':>8} {'audio s/s':>10} {'MFU':>6} {'peak GiB':>9}")
for r in rows:
    name = f"{r['model']} {r.get('framework') or ('peer' if r.get('peer') else '')}".strip()
    mfu = "-" if r.get("mfu") is None else f"{r['mfu']:.1%}"
    peak = r.get("peak_bytes_in_use_mib")
    peak = "-" if peak is None else f"{peak / 1024:.1f}"
    print(f"{r['tree']:9} {name:12} {r['step_ms']:8.0f} {r['audio_s_per_s']:10.0f} {mfu:>6} {peak:>9}")
for r in runs:
    if r["status"] != "ok":
        print(f"{r['tree']} {r['model']}: {r['status']}")
print(f"wrote {summary}")
EOF
