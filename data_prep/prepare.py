"""Turns a corpus into ArrayRecord shards, normalization statistics and a tokenizer.

    python -m data_prep.prepare --format manifest|librispeech|kaldi|tfds --input PATH
        --output DIR --split NAME [--num_shards N | --hours_per_shard H] [--seed S]
        [--tokenizer char|bpe|unigram] [--vocab_size V] [--alphabet CHARS]
        [--min_duration S] [--max_duration S] [--sample_rate 16000]
        [--audio_format pcm_s16le|flac] [--require_phonemes] [--verbose]
        [--runner DirectRunner]
        [other Beam options]

One Apache Beam pipeline (the shape of section IV of the 1M-hour paper in
``shared/references``: group by speaker early, equal shards, hierarchical shuffle,
statistics per shard in parallel, then summed):

    read items (--format reader, data_prep.readers) -> group by id, keep the first ->
    validate + decode + resample/downmix + encode record + per-record log-mel sums ->
    sum audio per speaker -> place speakers on shards (largest first onto the lightest shard;
    shard numbers permuted by --seed) -> group by shard -> write each shard in a seeded
    random order, summing its statistics -> per-shard metadata, skip/notice events,
    transcripts

The driver then writes ``DIR/<split>/{index.json, durations.npy, stats.json,
prep_report.json}`` (the statistics are the per-shard sums added in shard order), for a
split whose items carry phonemes (text-to-speech data, data_prep.phoneme_fields)
``DIR/<split>/phonemes.json`` (the sorted phoneme inventory with counts), and, for the
train split, ``DIR/tokenizer/``. Everything lands in a staging directory first and
replaces ``DIR/<split>`` only when complete, so a re-run never mixes old and new shards.

Every input item is either written or skipped with a counted reason (num_input ==
num_written + sum of skips). Records keep the RAW text; tokenization happens in the
training input pipeline. The same inputs and flags give byte-identical outputs.

Runner: by default, and whenever ``--runner DirectRunner`` is given, the pipeline runs on
Beam's FnApiRunner in ``multi_processing`` mode with one worker per CPU (that is what the
DirectRunner runs batch pipelines on, minus its attempt to download the Prism runner, which
would ignore the worker count). Any other runner and all its options pass through
unchanged; with a distributed runner, ``--output`` must be a filesystem every worker and
the launching machine mount (e.g. NFS, gcsfuse), because shards are written with
ArrayRecord's local-file writer.

Default number of shards: one per ``--hours_per_shard`` (1) of written audio, rounded, at
least 1, at most the number of records and at most 100,000. One hour of 16 kHz int16 audio
is ~115 MB: big enough that per-file overheads vanish, small enough that every host of a
large job gets many shards; the cap bounds the file count (100,000 shards still hold 10 h each at a
million hours).

Memory: the shuffle carries references, not audio. Each worker bundle appends its encoded
records to a spill file under the staging directory, and the shard writers copy them from
there in shard order, so neither the DirectRunner's in-memory shuffle nor a writer ever holds
a shard's audio (2,000 utterances, 2.2 h: ~0.4 GB peak instead of ~1.9 GB).
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from typing import Any

import apache_beam as beam
import numpy as np
from absl import flags
from apache_beam.runners.runner import PipelineState

from data_prep import upload
from data_prep.config import PrepConfig, define_flags, parse_args
from data_prep.phoneme_fields import INVENTORY_FILE, PhonemeInventoryFn, inventory
from data_prep.readers import READERS
from data_prep.readers.common import PrepareError
from data_prep.report import (
    DOWNMIXED,
    EVENTS,
    RESAMPLED,
    SKIPPED,
    TEXTS,
    EventSummaryFn,
    format_report,
    spread,
    summarize_events,
)
from data_prep.runner import pipeline_options, quiet_beam_output
from data_prep.sharding import (
    CountAndSecondsFn,
    WriteShard,
    default_num_shards,
    key_by_group,
    key_by_shard,
    place_groups,
    shard_file_name,
)
from data_prep.staging import (
    make_dirs,
    read_json,
    replace_dir,
    staging_path,
    write_json,
    write_shard_meta,
)
from data_prep.stats import combine_stats
from data_prep.tokenizer_training import TranscriptSampleFn, train_tokenizer
from data_prep.validate import KeepFirstOfId, ValidateAndEncode
from jaxspeech.common import files, storage
from jaxspeech.data import records


def build_pipeline(p: beam.Pipeline, cfg: PrepConfig, staging_dir: str) -> None:
    """Adds the whole preparation to ``p``; results land in ``staging_dir`` and its _parts/.

    read -> keep the first item of each id -> validate, encode, spill -> count -> speaker
    groups -> placement (one small table) -> group by shard -> write shards
    """
    parts = os.path.join(staging_dir, "_parts")
    spill_dir = os.path.join(staging_dir, "_spill")
    items = READERS[cfg.format](p, cfg)
    _ = (
        items
        | "CountInput" >> beam.combiners.Count.Globally()
        | "WriteNumInput" >> beam.Map(write_json, os.path.join(parts, "num_input.json"))
    )
    # Items are tiny (path + text). Grouping them by id finds duplicates before any audio is
    # read, and spreads the heavy per-item work over workers instead of leaving it fused
    # with whichever worker listed the input.
    unique = (
        items
        | "KeyById" >> beam.Map(lambda it: (it.id, it))
        | "GroupById" >> beam.GroupByKey()
        | "KeepFirstOfId" >> beam.ParDo(KeepFirstOfId()).with_outputs(EVENTS, main="items")
    )
    validated = unique.items | "Validate" >> beam.ParDo(
        ValidateAndEncode(cfg, spill_dir)
    ).with_outputs(EVENTS, main="prepared")
    prepared = validated.prepared
    if cfg.num_shards is not None:
        num_shards = p | "NumShards" >> beam.Create([cfg.num_shards])
    else:
        num_shards = (
            prepared
            | "CountSeconds" >> beam.CombineGlobally(CountAndSecondsFn())
            | "NumShards" >> beam.MapTuple(default_num_shards, hours_per_shard=cfg.hours_per_shard)
        )
    _ = (
        prepared
        | "PhonemesOf" >> beam.Map(lambda p: p.phonemes)
        | "PhonemeInventory" >> beam.CombineGlobally(PhonemeInventoryFn())
        | "WritePhonemes" >> beam.Map(write_json, os.path.join(parts, "phonemes.json"))
    )
    _ = num_shards | "WriteNumShards" >> beam.Map(
        write_json, os.path.join(parts, "num_shards.json")
    )
    num_shards_side = beam.pvalue.AsSingleton(num_shards)
    placement = (
        prepared
        | "KeyByGroup" >> beam.Map(key_by_group, num_shards_side)
        | "SumGroups" >> beam.CombinePerKey(sum)
        | "ListGroups" >> beam.combiners.ToList()
        | "PlaceGroups" >> beam.Map(place_groups, num_shards_side, seed=cfg.seed)
    )
    written = (
        prepared
        | "KeyByShard"
        >> beam.Map(key_by_shard, beam.pvalue.AsSingleton(placement), num_shards_side)
        | "GroupByShard" >> beam.GroupByKey()
        | "WriteShards"
        >> beam.ParDo(
            WriteShard(staging_dir, cfg.split, cfg.train_tokenizer, cfg.seed)
        ).with_outputs(EVENTS, TEXTS, main="shards")
    )
    _ = written.shards | "WriteShardMeta" >> beam.Map(write_shard_meta, parts)
    _ = (
        (unique[EVENTS], validated[EVENTS], written[EVENTS])
        | "AllEvents" >> beam.Flatten()
        | "SummarizeEvents" >> beam.CombineGlobally(EventSummaryFn())
        | "WriteEvents" >> beam.Map(write_json, os.path.join(parts, "events.json"))
    )
    if cfg.train_tokenizer:
        _ = (
            written[TEXTS]
            | "SampleTexts" >> beam.CombineGlobally(TranscriptSampleFn(cfg.tokenizer_max_sentences))
            | "WriteTexts" >> beam.Map(write_json, os.path.join(parts, "texts.json"))
        )


def _finalize_shards(
    cfg: PrepConfig, staging: str
) -> tuple[list[dict[str, Any]], np.ndarray, dict[str, Any] | None]:
    """Collects shard metadata (writing empty files for shards no group was placed in);
    returns (shards, durations in file order, statistics combined over shards)."""
    from array_record.python.array_record_module import ArrayRecordWriter

    parts = os.path.join(staging, "_parts")
    num_shards = int(read_json(os.path.join(parts, "num_shards.json")))
    metas = {}
    for name in os.listdir(parts):
        if name.startswith("shard-"):
            meta = read_json(os.path.join(parts, name))
            metas[meta["shard"]] = meta
    shards, durations, stats = [], [], []
    for shard in range(num_shards):
        meta = metas.get(shard)
        if meta is None:
            name = shard_file_name(cfg.split, shard, num_shards)
            ArrayRecordWriter(os.path.join(staging, name), "group_size:1").close()
            meta = {"path": name, "num_records": 0, "seconds": 0.0, "durations": [], "stats": None}
        shards.append({k: meta[k] for k in ("path", "num_records", "seconds")})
        durations.extend(meta["durations"])
        stats.append(meta["stats"])
    return shards, np.asarray(durations, np.float32), combine_stats(stats)


def _finalize(cfg: PrepConfig, staging: str, start_time: float) -> dict[str, Any]:
    """Turns the pipeline's outputs in ``staging`` into the split's files; returns the report."""
    parts = os.path.join(staging, "_parts")
    shards, durations, stats = _finalize_shards(cfg, staging)
    phonemes = inventory(read_json(os.path.join(parts, "phonemes.json")))
    if durations.size:  # no index for a split without records: nothing may take it as one
        if stats is not None:
            stats_path = os.path.join(staging, "stats.json")
            write_json({"feature": cfg.feature.as_dict(), **stats}, stats_path)
        if phonemes is not None:  # a split with phonemes (text-to-speech data)
            write_json(phonemes, os.path.join(staging, INVENTORY_FILE))
        records.write_split_index(  # last of the split's files: its completion mark
            staging,
            shards,
            durations,
            extra={
                "split": cfg.split,  # The staging directory's name is not the split's.
                "sample_rate": cfg.sample_rate,
                "audio_format": cfg.audio_format,
                "format": cfg.format,
                "input": cfg.input,
                "num_shards": len(shards),
            },
        )
    else:
        for shard in shards:  # the empty shard files of a split that has no records
            os.remove(os.path.join(staging, shard["path"]))
    events = summarize_events(read_json(os.path.join(parts, "events.json")))
    num_input = int(read_json(os.path.join(parts, "num_input.json")))
    num_written = int(durations.size)
    num_skipped = sum(e["count"] for e in events[SKIPPED].values())
    if num_input != num_written + num_skipped:  # An invariant; failing it is a bug here.
        raise RuntimeError(
            f"lost items: {num_input} in, {num_written} written, {num_skipped} skipped"
        )
    report = {
        "split": cfg.split,
        "format": cfg.format,
        "input": cfg.input,
        "num_input": num_input,
        "num_written": num_written,
        "hours_written": float(durations.astype(np.float64).sum() / 3600.0),
        "num_shards": len(shards),
        "shard_hours": spread([s["seconds"] / 3600.0 for s in shards]),
        "skipped": events[SKIPPED],
        "resampled": events[RESAMPLED],
        "downmixed": events[DOWNMIXED],
        "phonemes": None
        if phonemes is None
        else {k: phonemes[k] for k in ("utterances", "utterances_without", "num_phonemes")},
        "split_dir": cfg.split_dir,
        "elapsed_s": 0.0,
    }
    if cfg.train_tokenizer and num_written:
        # A failure here (e.g. --vocab_size too large for the corpus) is reported, not
        # raised: the shards are good and worth keeping; prepare() raises it afterwards.
        try:
            tokenizer = train_tokenizer(cfg, read_json(os.path.join(parts, "texts.json")))
        except PrepareError as e:
            report["tokenizer"] = {"kind": cfg.tokenizer, "error": str(e)}
        else:
            tok_staging = make_dirs(staging_path(cfg.output, "tokenizer"))
            tokenizer.save(tok_staging)
            replace_dir(tok_staging, os.path.join(cfg.output, "tokenizer"))
            report["tokenizer"] = {"kind": cfg.tokenizer, "vocab_size": tokenizer.vocab_size}
    shutil.rmtree(parts)
    shutil.rmtree(os.path.join(staging, "_spill"))
    report["elapsed_s"] = round(time.time() - start_time, 3)
    write_json(report, os.path.join(staging, "prep_report.json"))
    return report


def prepare(argv: list[str]) -> dict[str, Any]:
    """Runs the preparation for ``argv`` (argv[0] is the program name); returns the report.
    An object-store ``--output`` (s3://, gs://) is prepared locally and uploaded
    (data_prep.upload).

    Raises:
      PrepareError: a user mistake (bad flag, missing input, unwritable output, no records,
        a missing bucket).
    """
    cfg, beam_args = parse_args(argv)
    if storage.is_remote(cfg.output):
        return upload.prepare_to_store(cfg, lambda local: _prepare_local(local, beam_args))
    return _prepare_local(cfg, beam_args)


def _prepare_local(cfg: PrepConfig, beam_args: list[str]) -> dict[str, Any]:
    """The preparation of ``cfg`` into its local ``--output``."""
    start = time.time()
    options, runner = pipeline_options(beam_args)
    p = beam.Pipeline(runner=runner, options=options)
    staging = staging_path(cfg.output, cfg.split)
    try:
        build_pipeline(p, cfg, staging)  # Raises for a missing input before anything is written.
    except PrepareError:
        # Beam removes the pipeline's local temp directory only when the pipeline runs.
        shutil.rmtree(p.local_tempdir, ignore_errors=True)
        raise
    make_dirs(staging, subdirs=("_parts", "_spill"))
    try:
        result = p.run()
        state = result.wait_until_finish()
        if state not in (None, PipelineState.DONE):
            raise RuntimeError(f"pipeline ended in state {state}")
        report = _finalize(cfg, staging, start)
        report_path = os.path.join(cfg.split_dir, "prep_report.json")
        if report["num_written"] or not os.path.exists(cfg.split_dir):
            replace_dir(staging, cfg.split_dir)
        else:  # a failed preparation never replaces a split that was there
            report_path = f"{cfg.split_dir}.failed-prep_report.json"
            os.replace(os.path.join(staging, "prep_report.json"), report_path)
    finally:
        if os.path.exists(staging):
            shutil.rmtree(staging, ignore_errors=True)
    if report["num_written"] == 0:
        raise PrepareError(
            f"no records written from {cfg.input}: all {report['num_input']} items were skipped "
            f"(see {report_path}); no split was written"
        )
    if "error" in report.get("tokenizer", {}):
        raise PrepareError(
            f"{cfg.split_dir} was written but the tokenizer was not: {report['tokenizer']['error']}"
        )
    return report


def _define_verbose(fv: flags.FlagValues) -> None:
    flags.DEFINE_bool(
        "verbose",
        False,
        "Show Beam's routine log lines (its workers' INFO lines), which are dropped otherwise.",
        flag_values=fv,
        module_name="data_prep.prepare",
    )


def _take_verbose(argv: list[str]) -> tuple[list[str], bool]:
    """`--verbose` is the command's, not `prepare`'s (nor a Beam option): (argv without
    it, its value)."""
    fv = flags.FlagValues()
    _define_verbose(fv)
    try:
        return fv(argv, known_only=True), fv.verbose
    except flags.Error as e:
        raise PrepareError(str(e)) from e


def main(argv: list[str] | None = None) -> int:
    """CLI entry point: prints a summary, or one ``error:`` line and returns 2."""
    argv = list(sys.argv if argv is None else argv)
    if any(a in ("-h", "--help", "--helpfull") for a in argv[1:]):
        fv = flags.FlagValues()
        define_flags(fv)
        _define_verbose(fv)
        print(__doc__)
        print(fv.get_help())
        return 0
    try:
        argv, verbose = _take_verbose(argv)
        with quiet_beam_output(enabled=not verbose):
            report = prepare(argv)
    except PrepareError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except Exception as e:  # a full disk in the pipeline or the finalization: one line
        storage = files.storage_error(e)
        if not storage:
            raise
        print(f"error: storage: {storage} (the split was not replaced)", file=sys.stderr)
        return 5
    print(format_report(report))
    return 0


if __name__ == "__main__":
    # Run the copy imported under its real name: Beam workers unpickle DoFns and elements by
    # module path, and "__main__" in a worker is the worker itself.
    from data_prep import prepare as _prepare
    from jaxspeech.common import cli

    with cli.interrupt_as_one_line("prepare"):
        sys.exit(_prepare.main())
