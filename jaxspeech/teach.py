r"""Teacher targets for distillation and pseudo-labels: `python -m jaxspeech.teach`.

    python -m jaxspeech.teach --teacher RUN --data DIR --split NAME --top_k K \
        --output OUT [--step S] [--batch_seconds X] [--max_shards N] \
        [--pseudo_labels PDIR [--min_confidence C]] [multi-host flags]

(`--workdir RUN`, the name every other command gives a run, is the same as `--teacher`.)

A CTC teacher (a run with a CTC head) labels a prepared split: per input shard i of n it
writes ``OUT/NAME/targets-<i>-of-<n>.array_record``, one target record per input record in
the same order (`jaxspeech.distill.records`): the K most probable labels of every teacher
frame with their float16 log-posteriors, the greedy CTC transcript (decoded as evaluation's
ctc_greedy decodes) and its confidence. `read_targets(OUT, NAME)` reads them back by
(shard, index).

Confidence = exp(mean over the T' frames of log max_v p_t(v)): the geometric mean of the
greedy path's per-frame posterior, P(greedy path) ** (1 / T'). It is normalized by length
(long and short utterances compare), lies in (0, 1], and, unlike the arithmetic mean of the
max posteriors, a few near-uniform frames (where a word is likely wrong) pull it down
multiplicatively instead of being averaged away by the many confident blank frames. It is
computed in float32; exp(mean(logprobs[:, 0])) of a record gives it back to float16
rounding. An utterance with no frames scores 0.

Multi-host: every process joins the `jax.distributed` job, restores the teacher onto a mesh
of its own local devices and labels the input shards i with i % P == p. Inference needs no
collective, so no process waits for another while labelling; the processes exchange their
lists of shards once at the start, and at the end each waits for the completion markers of
every shard of this invocation; process 0 then writes ``OUT/NAME/targets.json`` (teacher,
step, K, V, frame rate, totals, throughput) once every shard is complete.

Resumable: a shard is written under a temporary name, renamed when complete, then marked
with ``<shard>.done.json`` (records, bytes, the source shard and its record count). A rerun
skips a shard whose marker matches and redoes any other from scratch; `--max_shards N`
labels at most N shards per process and invocation (time-limited queues). Batches have the
teacher's fixed evaluation bucket shapes, in eval mode, so the bytes are the same however
the job is split, stopped and restarted (same devices per process).

Records that cannot be read, and utterances longer than the teacher's last bucket, get a
target record marked missing (alignment holds); they are counted and reported with the
reason, never dropped silently.

`--pseudo_labels PDIR` also writes the prepared split PDIR/NAME (one shard per input shard,
index, durations, stats.json copied from DIR/NAME: the same audio, a subset of it) of the
records whose confidence >= `--min_confidence`, the transcript replaced by the teacher's
(audio samples unchanged), and PDIR/tokenizer, the teacher's own (its transcripts and
target indices are in the teacher's labels). ``index.json`` is written last, once every
shard is complete, so a split with an index is a complete one.
"""

from __future__ import annotations

from absl import app, flags, logging

from jaxspeech.common import cli
from jaxspeech.distill import job as job_lib
from jaxspeech.distill import label
from jaxspeech.parallel import mesh as mesh_lib

# ---------------------------------------------------------------- the summary


# ---------------------------------------------------------------- command line
FLAGS = flags.FLAGS


def define_flags(fv: flags.FlagValues = flags.FLAGS) -> None:
    """This command's flags (the multi-host ones come from `mesh.define_flags`)."""
    flags.DEFINE_string(
        "teacher", None, "Run directory of the CTC teacher (also: --workdir).", flag_values=fv
    )
    # --workdir names the run on every other command: the teacher's run here.
    flags.DEFINE_alias("workdir", "teacher", flag_values=fv)
    flags.DEFINE_string(
        "data", None, "Prepared data directory (or an s3://, gs:// URL).", flag_values=fv
    )
    flags.DEFINE_string("split", None, "Split of --data to label.", flag_values=fv)
    flags.DEFINE_integer("top_k", None, "Labels kept per frame, in [1, V].", flag_values=fv)
    flags.DEFINE_string("output", None, "Targets directory: OUT/<split>/.", flag_values=fv)
    for name in ("teacher", "data", "split", "top_k", "output"):
        flags.mark_flag_as_required(name, flag_values=fv)
    flags.DEFINE_integer("step", None, "Teacher checkpoint (default: latest).", flag_values=fv)
    flags.DEFINE_float(
        "batch_seconds",
        None,
        "Padded audio per batch (default: the teacher's data.batch_seconds).",
        flag_values=fv,
    )
    flags.DEFINE_integer(
        "max_shards",
        None,
        "Label at most this many shards per process in this invocation, then stop (a "
        "time-limited queue); run again to continue.",
        flag_values=fv,
    )
    flags.DEFINE_string(
        "pseudo_labels",
        None,
        "Also write a prepared split PDIR/<split> of the confident utterances with the "
        "teacher's transcripts.",
        flag_values=fv,
    )
    flags.DEFINE_float(
        "min_confidence",
        None,
        "With --pseudo_labels: keep utterances of at least this confidence (default 0).",
        flag_values=fv,
    )


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        cli.usage_error(f"unexpected arguments: {argv[1:]}")
    if FLAGS.min_confidence is not None and not FLAGS.pseudo_labels:
        cli.usage_error("--min_confidence needs --pseudo_labels")
    req = job_lib.Request(
        teacher=FLAGS.teacher,
        data=FLAGS.data,
        split=FLAGS.split,
        top_k=FLAGS.top_k,
        output=FLAGS.output,
        step=FLAGS.step,
        batch_seconds=FLAGS.batch_seconds,
        pseudo_dir=FLAGS.pseudo_labels,
        min_confidence=FLAGS.min_confidence or 0.0,
        max_shards=FLAGS.max_shards,
    )
    cli.run_job(lambda: label.label_split(req))


if __name__ == "__main__":
    mesh_lib.define_flags()
    define_flags()
    logging.set_verbosity(logging.WARNING)  # keep Orbax's per-restore INFO lines off the console
    app.run(main, flags_parser=cli.parse_flags)
