"""Checks prepared shards record by record, reports what is bad, and can repair a split.

    python -m data_prep.verify DIR [--split S [--split S2 ...]] [--report PATH] [--repair]
        [--verbose] [--runner DirectRunner] [other Beam options]

DIR may be an object-store URL (s3://, gs://): its committed splits are mirrored into the
local cache (jaxspeech.common.storage) and checked there; --repair takes local directories only.

For every shard of every split (default: every split under DIR): the file exists and opens,
holds the record count `index.json` gives, and every record reads, decodes (header and
audio), is at the index's sample rate and has the duration `durations.npy` gives. Shards
are checked in parallel on Apache Beam, one shard per element (the DirectRunner on this
machine's cores by default; any Beam runner for corpora of many machines' worth of shards).

The report (default ``DIR/verify.json``) lists per split the bad shards (missing,
unreadable, wrong record count) and bad records (shard, index, id when readable, error);
the same is printed. Exit status: 0 when everything is good (or was repaired), 1 when
something is bad, 2 for a command mistake.

``--repair`` rewrites each shard that has bad records with its good ones, in their order,
drops shards that cannot be opened at all (their records are lost: the report counts them),
and rewrites ``index.json`` and ``durations.npy`` to match. Nothing is deleted: originals go
to ``DIR/<split>/set_aside/<time>/``. Repairing changes the split's record numbering, so a
training run on it resumes with another data order; runs started after the repair are
unaffected. Normalization statistics (``stats.json``) are left as they were: a few records
less do not move them.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from typing import Any

import apache_beam as beam
import numpy as np

from data_prep.runner import pipeline_options, quiet_beam_output
from jaxspeech.common import files, storage
from jaxspeech.common.errors import UserError
from jaxspeech.data import reader as reader_lib
from jaxspeech.data import records

READ_BLOCK = 256  # records per read call: big enough to amortize, small enough for memory
DURATION_TOLERANCE_S = 1e-3  # durations.npy holds float32 seconds
SET_ASIDE = "set_aside"


class VerifyError(Exception):
    """A command mistake: no such directory or split."""


# ---------------------------------------------------------------------------------------------
# One shard
# ---------------------------------------------------------------------------------------------


def check_record(data: bytes, expected_duration: float | None, sample_rate: int) -> tuple[str, str]:
    """(utterance id or "", problem or "") of one record's bytes; `expected_duration` None:
    a record past the index's count, which has none to compare with."""
    try:
        rec = records.decode_record(data)
    except ValueError as e:
        try:
            return records.decode_header(data)["id"], str(e)
        except ValueError:
            return "", str(e)
    if rec["sample_rate"] != sample_rate:
        return rec["id"], f"sample rate {rec['sample_rate']} Hz, the split is at {sample_rate} Hz"
    actual = len(rec["audio"]) / rec["sample_rate"]
    if expected_duration is not None and abs(actual - expected_duration) > DURATION_TOLERANCE_S:
        return rec["id"], f"{actual:.3f} s of audio, the index says {expected_duration:.3f} s"
    return rec["id"], ""


def verify_shard(
    path: str,
    expected: int,
    durations: list[float],
    sample_rate: int,
    retry: reader_lib.RetryPolicy | None = None,
) -> dict[str, Any]:
    """Every record of one shard checked.

    Args:
      path: the shard file; expected: the records the index gives it; durations: theirs.

    Returns:
      {path, expected, found (None: cannot be opened), problem ("" or why the shard as a
       whole is bad), bad_records: [{index, id, error}], good: indices of the
       usable records when the shard has bad ones (empty for a clean shard)}.
    """
    found, problem = reader_lib.shard_status(path, expected)
    out = {"path": path, "expected": expected, "found": found, "problem": problem}
    out |= {"bad_records": [], "good": []}
    if found is None:
        return out
    reader = reader_lib.RecordReader([path], [found], retry or reader_lib.DEFAULT_RETRY)
    for start in range(0, found, READ_BLOCK):
        positions = list(range(start, min(found, start + READ_BLOCK)))
        data, faults, _ = reader.read(positions)
        errors = {f.position: f.error for f in faults}
        for i, raw in zip(positions, data):
            utt, error = "", errors.get(i, "")
            if raw is not None:
                duration = durations[i] if i < len(durations) else None
                utt, error = check_record(raw, duration, sample_rate)
            if error:
                out["bad_records"].append({"index": i, "id": utt, "error": error})
            else:
                out["good"].append(i)
    if not (out["problem"] or out["bad_records"]):
        out["good"] = []  # a clean shard is kept whole: no need to carry its record list
    return out


# ---------------------------------------------------------------------------------------------
# A split, on Beam
# ---------------------------------------------------------------------------------------------


def split_names(data_dir: str, splits: list[str] | None) -> list[str]:
    """The splits to check: the given ones (each must be prepared), else every one in DIR."""
    if not os.path.isdir(data_dir):
        raise VerifyError(f"{data_dir} is not a directory")
    found = sorted(
        d
        for d in os.listdir(data_dir)
        if os.path.isfile(os.path.join(data_dir, d, records.INDEX_FILE))
    )
    # The index is written last: a directory with a split's other files and no index is
    # what a failed or interrupted preparation left, never a split to pass.
    incomplete = [
        d
        for d in sorted(os.listdir(data_dir))
        if d not in found
        and (not splits or d in splits)
        and os.path.isdir(os.path.join(data_dir, d))
        and any(
            n == "prep_report.json" or n.endswith(".array_record")
            for n in os.listdir(os.path.join(data_dir, d))
        )
    ]
    if incomplete:
        raise VerifyError(
            f"{', '.join(os.path.join(data_dir, d) for d in incomplete)}: not a complete split "
            f"(no {records.INDEX_FILE}, the mark of a finished preparation): its preparation "
            "failed or did not finish; see its prep_report.json if any, and prepare it again"
        )
    if not splits:
        if not found:
            raise VerifyError(f"{data_dir} holds no prepared split (no */{records.INDEX_FILE})")
        return found
    missing = [s for s in splits if s not in found]
    if missing:
        raise VerifyError(
            f"{data_dir} has no prepared split {', '.join(missing)} (it has: "
            f"{', '.join(found) or 'none'})"
        )
    return splits


def _tasks(index: records.SplitIndex) -> list[tuple[str, int, str, int, list[float], int]]:
    """One Beam element per shard: (split, shard number, path, records, their durations,
    sample rate)."""
    starts = np.concatenate([[0], np.cumsum(index.shard_num_records)])
    return [
        (
            index.split,
            i,
            path,
            n,
            index.durations[starts[i] : starts[i] + n].tolist(),
            index.sample_rate,
        )
        for i, (path, n) in enumerate(zip(index.shard_paths, index.shard_num_records))
    ]


def _verify_task(task: tuple) -> tuple[str, int, dict]:
    split, shard, path, n, durations, sample_rate = task
    return split, shard, verify_shard(path, n, durations, sample_rate)


def run_checks(data_dir: str, splits: list[str], beam_args: list[str]) -> dict[str, list[dict]]:
    """Every shard of `splits` verified on Beam; {split: [shard report, in index order]}."""
    indexes = {s: records.read_split_index(data_dir, s) for s in splits}
    tasks = [task for ix in indexes.values() for task in _tasks(ix)]
    options, runner = pipeline_options(beam_args)
    with tempfile.TemporaryDirectory() as tmp:
        out_path = os.path.join(tmp, "reports.json")
        with beam.Pipeline(runner=runner, options=options) as p:
            _ = (
                p
                | "Shards" >> beam.Create(tasks)
                | "Spread" >> beam.Reshuffle()  # one shard per worker at a time
                | "Verify" >> beam.Map(_verify_task)
                | "Collect" >> beam.combiners.ToList()
                | "Write" >> beam.Map(_write_json, out_path)
            )
        with open(out_path) as f:
            collected = json.load(f)
    by_split: dict[str, list[dict]] = {s: [None] * len(ix.shard_paths) for s, ix in indexes.items()}
    for split, shard, report in collected:
        by_split[split][shard] = report
    return by_split


def _write_json(value: Any, path: str) -> None:
    files.atomic_json(path, value, indent=None)


def summarize(split: str, shards: list[dict]) -> dict[str, Any]:
    """The report of one split: counts, and the bad shards with their bad records."""
    bad = [s for s in shards if s["problem"] or s["bad_records"]]
    unusable = sum(len(s["bad_records"]) if s["found"] is not None else s["expected"] for s in bad)
    return {
        "split": split,
        "shards": len(shards),
        "records": sum(s["expected"] for s in shards),
        "bad_shards": len(bad),
        "bad_records": unusable,
        "problems": [
            {k: s[k] for k in ("path", "expected", "found", "problem", "bad_records")} for s in bad
        ],
    }


# ---------------------------------------------------------------------------------------------
# Repair
# ---------------------------------------------------------------------------------------------


def _rewrite_shard(path: str, found: int, good: list[int]) -> np.ndarray:
    """`path` rewritten with its records `good`, in order (through a temporary file);
    returns their (len(good),) float32 durations, from their headers."""
    from array_record.python.array_record_module import ArrayRecordWriter

    reader = reader_lib.RecordReader([path], [found])
    tmp = path + ".repairing"
    writer, durations = ArrayRecordWriter(tmp, "group_size:1"), []
    for start in range(0, len(good), READ_BLOCK):
        data, faults, _ = reader.read(good[start : start + READ_BLOCK])
        if faults:  # read well a moment ago: the storage is failing now
            writer.close()
            os.remove(tmp)
            raise OSError(f"{path}: record {faults[0].index} no longer reads: {faults[0].error}")
        for record in data:
            writer.write(record)
            durations.append(records.decode_header(record)["duration"])
    writer.close()
    os.replace(tmp, path + ".repaired")
    return np.array(durations, np.float32)


def repair_split(data_dir: str, split: str, shards: list[dict]) -> dict[str, Any]:
    """Rewrites the split without its bad records (see the module docstring).

    Returns {set_aside: directory of the originals, rewritten: [shard], dropped: [shard],
    records_removed: n}.
    """
    split_dir = os.path.join(data_dir, split)
    index_path = os.path.join(split_dir, records.INDEX_FILE)
    with open(index_path) as f:
        raw_index = json.load(f)
    # Moves and rewrites stay inside the split, whatever its index names (a crafted
    # index must not move a file of the user's into it).
    for entry in raw_index["shards"]:
        files.inside(split_dir, entry["path"], index_path)
    durations = np.load(os.path.join(split_dir, records.DURATIONS_FILE))
    aside = os.path.join(split_dir, SET_ASIDE, time.strftime("%Y%m%d-%H%M%S"))
    os.makedirs(aside, exist_ok=True)
    for name in (records.INDEX_FILE, records.DURATIONS_FILE):
        shutil.copy2(os.path.join(split_dir, name), os.path.join(aside, name))
    new_shards, new_durations, rewritten, dropped, start = [], [], [], [], 0
    for entry, report in zip(raw_index["shards"], shards):
        n, path = int(entry["num_records"]), report["path"]
        mine = durations[start : start + n]
        start += n
        if not (report["problem"] or report["bad_records"]):
            new_shards.append(entry)
            new_durations.append(mine)
            continue
        usable = report["found"] is not None and bool(report["good"])
        kept = _rewrite_shard(path, report["found"], report["good"]) if usable else None
        if os.path.exists(path):
            shutil.move(path, os.path.join(aside, entry["path"]))
        if kept is None:
            dropped.append(entry["path"])
            continue
        os.replace(path + ".repaired", path)
        rewritten.append(entry["path"])
        new_shards.append(
            {"path": entry["path"], "num_records": len(kept), "seconds": float(kept.sum())}
        )
        new_durations.append(kept)
    extra = {k: v for k, v in raw_index.items() if k not in ("num_records", "seconds", "shards")}
    all_durations = np.concatenate(new_durations) if new_durations else np.zeros(0, np.float32)
    records.write_split_index(split_dir, new_shards, all_durations, extra)
    return {
        "set_aside": aside,
        "rewritten": rewritten,
        "dropped": dropped,
        "records_removed": int(durations.size - all_durations.size),
    }


# ---------------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------------


def format_split(summary: dict[str, Any], max_records: int = 10) -> str:
    lines = [
        f"{summary['split']}: {summary['shards']} shards, {summary['records']} records; "
        f"{summary['bad_shards']} bad shards, {summary['bad_records']} unusable records"
    ]
    for s in summary["problems"]:
        what = s["problem"] or f"{len(s['bad_records'])} bad records"
        lines.append(f"  {s['path']}: {what}")
        for r in s["bad_records"][:max_records]:
            lines.append(f"    record {r['index']} {r['id'] or '(no id)'}: {r['error']}")
        if len(s["bad_records"]) > max_records:
            lines.append(f"    ... {len(s['bad_records']) - max_records} more in the report")
    return "\n".join(lines)


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    parser = argparse.ArgumentParser(
        prog="python -m data_prep.verify", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "data_dir", help="a directory written by data_prep.prepare (or an s3://, gs:// URL)"
    )
    parser.add_argument("--split", action="append", help="a split to check (repeatable)")
    parser.add_argument(
        "--report", help="report file (default: DIR/verify.json; for a URL, in its local mirror)"
    )
    parser.add_argument("--repair", action="store_true", help="rewrite without bad records")
    parser.add_argument(
        "--verbose", action="store_true", help="show Beam's routine log lines (dropped otherwise)"
    )
    return parser.parse_known_args(argv)


def store_mirror(url: str, splits: list[str] | None, repair: bool) -> str:
    """The local mirror (jaxspeech.common.storage) of an object-store DIR's splits to check: the
    given ones, else every committed one (a prefix with an index.json).

    Raises:
      VerifyError: --repair (it rewrites shards in place), a prefix with shards but no
        index.json, or a store error (one line).
    """
    if repair:
        raise VerifyError(
            f"--repair rewrites shards in place; it takes a local directory, not {url} "
            "(verify the store's splits here, repair a local copy and prepare it again)"
        )
    try:
        listing = storage.list_files(url) if storage.exists(url) else {}
        if splits is None:
            splits = sorted({n.split("/")[0] for n in listing if n.count("/") == 1})
            splits = [s for s in splits if f"{s}/{records.INDEX_FILE}" in listing]
            bad = {n.split("/")[0] for n in listing if n.endswith(".array_record")} - set(splits)
            if bad:
                raise VerifyError(
                    f"{', '.join(storage.join(url, b) for b in sorted(bad))}: not a complete "
                    f"split (no {records.INDEX_FILE}, uploaded last)"
                )
        return storage.local_data(url, *splits)
    except storage.StorageError as e:
        raise VerifyError(str(e)) from e


def main(argv: list[str] | None = None) -> int:
    args, beam_args = parse_args(list(sys.argv[1:] if argv is None else argv))
    source = args.data_dir
    try:
        if storage.is_remote(source):  # checked on its local mirror
            args.data_dir = store_mirror(source, args.split, args.repair)
        splits = split_names(args.data_dir, args.split)
    except VerifyError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    try:
        with quiet_beam_output(enabled=not args.verbose):
            by_split = run_checks(args.data_dir, splits, beam_args)
    except UserError as e:  # an index naming files outside its split, for one
        print(f"error: {e}", file=sys.stderr)
        return 2
    where = source if storage.is_remote(source) else os.path.abspath(source)
    report = {"data_dir": where, "splits": {}}
    status = 0
    for split, shards in by_split.items():
        summary = summarize(split, shards)
        print(format_split(summary))
        if summary["records"] == 0:  # nothing to train or score on is not a healthy split
            print(f"  error: split {split} holds no records", file=sys.stderr)
            status = 1
        if summary["bad_shards"] and args.repair:
            summary["repair"] = repair_split(args.data_dir, split, shards)
            r = summary["repair"]
            print(
                f"  repaired: {len(r['rewritten'])} shards rewritten, {len(r['dropped'])} "
                f"dropped, {r['records_removed']} records removed; originals in "
                f"{r['set_aside']}"
            )
        elif summary["bad_shards"]:
            status = 1
        report["splits"][split] = summary
    path = args.report or os.path.join(args.data_dir, "verify.json")
    _write_json(report, path)
    print(f"report: {path}")
    return status


if __name__ == "__main__":
    # Run the copy imported under its real name: Beam workers unpickle functions by module
    # path, and "__main__" in a worker is the worker itself.
    from data_prep import verify as _verify
    from jaxspeech.common import cli

    with cli.interrupt_as_one_line("verify"):
        sys.exit(_verify.main())
