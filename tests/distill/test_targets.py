"""`python -m jaxspeech.teach` on a 3-shard split of the tiny corpus (one corrupt
record, one utterance longer than the teacher's last bucket) with the session's tiny CTC
run as the teacher: the record format, the targets against the model run directly, record
alignment, 2 processes against 1, a stopped and restarted job, the pseudo-label split
(loaded by the input pipeline and trained on), and the user errors."""

import dataclasses
import json
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from array_record.python.array_record_module import ArrayRecordWriter
from flax import nnx

from jaxspeech.common.errors import UserError
from jaxspeech.data import pipeline as pipeline_lib
from jaxspeech.data import reader as reader_lib
from jaxspeech.data import records
from jaxspeech.data.tokenizer import Tokenizer, normalize_text
from jaxspeech.decoding import ctc as ctc_decoding
from jaxspeech.distill import job as job_lib
from jaxspeech.distill import records as trecords
from jaxspeech.parallel import mesh as mesh_lib
from jaxspeech.runs import loading
from tests.e2e.cli import run_module, tiny_train_args
from tests.e2e.conftest import corpus, tiny_run  # noqa: F401  (the session's fixtures)
from tests.sharing import built_once

pytestmark = pytest.mark.slow

SPLIT, SHARDS, PER_SHARD, K = "train", 3, 8, 4
LAST_BUCKET = 6.5  # configs/demo.py: data.eval_bucket_boundaries[-1], the teacher's


# ---------------------------------------------------------------- the split and the runs
def _write_split(src: str, dst: str) -> None:
    """DST/train: 24 records of the tiny corpus's train split in 3 shards, plus bytes that
    are no record (shard 1, index 3) and an utterance of 3 joined ones (shard 2, index 1)."""
    index = records.read_split_index(src, "train")
    raw, _, _ = reader_lib.RecordReader(index.shard_paths, index.shard_num_records).read(
        range(SHARDS * PER_SHARD)
    )
    recs = [records.decode_record(r) for r in raw]
    joined = np.concatenate([r["audio"] for r in recs[:3]])
    assert len(joined) / 16000 > LAST_BUCKET
    shards = [
        [(raw[j], recs[j]["duration"]) for j in range(i * PER_SHARD, (i + 1) * PER_SHARD)]
        for i in range(SHARDS)
    ]
    shards[1].insert(3, (b"not a record", 2.0))
    long_rec = records.encode_record(
        id="joined-0001", audio=joined, sample_rate=16000, text="x", speaker="s"
    )
    shards[2].insert(1, (long_rec, len(joined) / 16000))
    split_dir = os.path.join(dst, SPLIT)
    os.makedirs(split_dir)
    metas, durations = [], []
    for i, items in enumerate(shards):
        name = f"{SPLIT}-{i:05d}-of-{SHARDS:05d}.array_record"
        writer = ArrayRecordWriter(os.path.join(split_dir, name), "group_size:1")
        for data, _ in items:
            writer.write(data)
        writer.close()
        metas.append({"path": name, "num_records": len(items), "seconds": sum(d for _, d in items)})
        durations += [d for _, d in items]
    records.write_split_index(split_dir, metas, np.array(durations), {"sample_rate": 16000})
    shutil.copy(os.path.join(src, "train", "stats.json"), split_dir)
    shutil.copytree(os.path.join(src, "tokenizer"), os.path.join(dst, "tokenizer"))


@pytest.fixture(scope="module")
def data(corpus, tmp_path_factory):  # noqa: F811
    _, shards = corpus

    def build(root):
        _write_split(shards, root)
        return ""

    return built_once(tmp_path_factory, "distill-data", build)[0]


def job_args(teacher, data_dir, output, *extra) -> list[str]:
    return [
        f"--teacher={teacher}",
        f"--data={data_dir}",
        f"--split={SPLIT}",
        f"--top_k={K}",
        f"--output={output}",
        *extra,
    ]


@pytest.fixture(scope="module")
def reference(data, tiny_run, tmp_path_factory):  # noqa: F811
    """(OUT, console): the job in one process, uninterrupted, no pseudo-labels."""

    def build(out):
        return run_module("jaxspeech.teach", *job_args(tiny_run[0], data, out)).stdout

    return built_once(tmp_path_factory, "distill-reference", build)


def _targets(out) -> list[dict]:
    reader = trecords.read_targets(str(out), SPLIT)
    return reader.read_positions(range(len(reader)))


def _threshold(out) -> float:
    """The median confidence: some utterances are kept, some dropped."""
    return float(np.median([t["confidence"] for t in _targets(out) if t["missing"] is None]))


def _stat(path) -> list[int]:
    st = os.stat(path)
    return [st.st_ino, st.st_mtime_ns]


@pytest.fixture(scope="module")
def resumed(data, tiny_run, reference, tmp_path_factory):  # noqa: F811
    """(root, its record): with pseudo-labels, the job stopped after one shard
    (--max_shards), a kill in the middle of the next one staged (its temporary file half
    written, no marker), then run again to the end."""

    def build(root):
        out, pdir = root / "out", root / "pseudo"
        threshold = _threshold(reference[0])
        args = job_args(tiny_run[0], data, out, f"--pseudo_labels={pdir}")
        args.append(f"--min_confidence={threshold}")
        first = run_module("jaxspeech.teach", *args, "--max_shards=1").stdout
        shard0 = out / SPLIT / trecords.targets_name(0, SHARDS)
        summary_after_first = (out / SPLIT / trecords.SUMMARY_FILE).exists()
        stats = {"shard": _stat(shard0), "marker": _stat(f"{shard0}{trecords.DONE_SUFFIX}")}
        half = out / SPLIT / (trecords.targets_name(1, SHARDS) + trecords.TEMP_SUFFIX)
        half.write_bytes(b"half of a shard")
        second = run_module("jaxspeech.teach", *args).stdout
        info = {"threshold": threshold, "first": first, "second": second, "stats": stats}
        return json.dumps(info | {"summary_after_first": summary_after_first})

    root, text = built_once(tmp_path_factory, "distill-resumed", build)
    return root, json.loads(text)


def _same_files(a, b) -> None:
    names = sorted(n for n in os.listdir(a) if n.endswith(".array_record"))
    assert names == [trecords.targets_name(i, SHARDS) for i in range(SHARDS)]
    assert names == sorted(n for n in os.listdir(b) if n.endswith(".array_record"))
    for name in names:
        with open(os.path.join(a, name), "rb") as fa, open(os.path.join(b, name), "rb") as fb:
            assert fa.read() == fb.read(), name


# ---------------------------------------------------------------- the record format
@pytest.mark.parametrize("vocab", [30, 40_000])
def test_target_record_round_trip(vocab):
    rng = np.random.default_rng(0)
    dtype = trecords.index_dtype(vocab)
    assert dtype == ("int16" if vocab <= 32767 else "int32")
    idx = rng.integers(0, vocab, (7, K))
    idx[0, 0] = vocab - 1  # the largest id survives
    lp = -rng.exponential(3.0, (7, K)).astype(np.float32)
    data = trecords.encode_target_record(
        id="u1", indices=idx, logprobs=lp, transcript="héllo", confidence=0.25,
        index_dtype=dtype, k=K,
    )  # fmt: skip
    assert len(data) < 8 + 200 + idx.size * (np.dtype(dtype).itemsize + 2)  # raw arrays
    t = trecords.decode_target_record(data)
    assert (t["id"], t["num_frames"], t["k"], t["transcript"]) == ("u1", 7, K, "héllo")
    assert t["confidence"] == 0.25 and t["missing"] is None
    assert t["indices"].dtype == np.dtype(dtype) and t["logprobs"].dtype == np.float16
    np.testing.assert_array_equal(t["indices"], idx)
    np.testing.assert_array_equal(t["logprobs"], lp.astype(np.float16))

    missing = {"kind": "unreadable", "reason": "bad bytes"}
    empty = np.zeros((0, K))
    m = trecords.decode_target_record(
        trecords.encode_target_record(
            id="",
            indices=empty,
            logprobs=empty,
            transcript="",
            confidence=None,
            index_dtype=dtype,
            k=K,
            missing=missing,
        )  # fmt: skip
    )
    assert m["missing"] == missing and m["indices"].shape == (0, K) and m["confidence"] is None

    with pytest.raises(ValueError, match="bad magic"):
        trecords.decode_target_record(b"JSR1" + data[4:])
    with pytest.raises(ValueError, match="payload"):
        trecords.decode_target_record(data[:-1])
    with pytest.raises(ValueError, match="must both be"):
        trecords.encode_target_record(
            id="u", indices=idx, logprobs=lp[:, :2], transcript="", confidence=0.0,
            index_dtype=dtype, k=K,
        )  # fmt: skip
    if dtype == "int16":
        with pytest.raises(ValueError, match="outside"):
            trecords.encode_target_record(
                id="u", indices=idx + 40_000, logprobs=lp, transcript="", confidence=0.0,
                index_dtype=dtype, k=K,
            )  # fmt: skip


# ---------------------------------------------------------------- the reference run
def test_targets_match_the_teacher_run_directly(data, tiny_run, reference):  # noqa: F811
    """Three utterances (both buckets) through the model one at a time, unpadded."""
    assert "1 unreadable, 1 too long" in reference[1]
    reader = trecords.read_targets(str(reference[0]), SPLIT)
    summary = reader.summary
    assert (summary["k"], summary["vocab_size"], summary["index_dtype"]) == (K, 30, "int16")
    assert summary["frame_rate_hz"] == 25.0 and summary["subsampling"] == 4
    index = records.read_split_index(str(data), SPLIT)
    start2 = sum(index.shard_num_records[:2])
    longer = [j for j in range(2, 9) if 3.0 < index.durations[start2 + j] < LAST_BUCKET]
    by_shard = [(0, 0), (0, 1), (2, longer[0])]  # the second one in the 6.5 s bucket
    mesh = mesh_lib.make_mesh({"data": 1}, devices=jax.devices()[:1])
    run = loading.load_run(str(tiny_run[0]), mesh=mesh)
    model = nnx.merge(run.spec.graphdef, run.params, run.model_vars)
    for shard, j in by_shard:
        path, count = index.shard_paths[shard], index.shard_num_records[shard]
        raw, _, _ = reader_lib.RecordReader([path], [count]).read([j])
        rec = records.decode_record(raw[0])
        audio = reader_lib.audio_float32(rec)
        with jax.set_mesh(mesh):
            enc, lengths = model(jnp.asarray(audio[None]), jnp.array([len(audio)]), train=False)
            logits = np.asarray(model.ctc_logits(enc))[0, : int(lengths[0])]
        x = logits.astype(np.float64)
        logp = x - x.max(1, keepdims=True)
        logp -= np.log(np.exp(logp).sum(1, keepdims=True))
        t = reader[shard, j]
        assert t["id"] == rec["id"] and t["num_frames"] == len(logp) > 0
        stored = t["logprobs"].astype(np.float64)
        # The stored labels have the log-probs stored (ties aside, any order of equals),
        # and those are the K best, best first.
        got = np.take_along_axis(logp, t["indices"].astype(np.int64), axis=1)
        np.testing.assert_allclose(stored, got, atol=1e-2, rtol=2e-3)
        np.testing.assert_allclose(stored, -np.sort(-logp, axis=1)[:, :K], atol=1e-2, rtol=2e-3)
        labels = ctc_decoding.collapse(logits.argmax(-1)[None], [len(logits)], 0)[0]
        assert t["transcript"] == run.tokenizer.decode(labels)
        np.testing.assert_allclose(t["confidence"], np.exp(logp.max(1).mean()), rtol=1e-4)
        # The definition holds in the stored numbers too, to float16 rounding.
        np.testing.assert_allclose(t["confidence"], np.exp(stored[:, 0].mean()), rtol=1e-2)


def test_every_input_record_has_its_target_at_the_same_place(data, reference):
    index = records.read_split_index(str(data), SPLIT)
    reader = trecords.read_targets(str(reference[0]), SPLIT)
    assert reader.shard_num_records == index.shard_num_records and len(reader) == 26
    kinds = []
    for shard, (path, count) in enumerate(zip(index.shard_paths, index.shard_num_records)):
        raw, _, _ = reader_lib.RecordReader([path], [count]).read(range(count))
        for j, data_j in enumerate(raw):
            t = reader[shard, j]
            try:
                rid = records.decode_header(data_j)["id"]
            except ValueError:  # the corrupt record: a missing target, without an id
                assert t["id"] == "" and t["missing"]["kind"] == "unreadable"
                assert "bad magic" in t["missing"]["reason"]
                kinds.append(("unreadable", shard, j))
                continue
            assert t["id"] == rid
            if t["missing"] is not None:
                assert t["missing"]["kind"] == "too_long" and "6.5 s" in t["missing"]["reason"]
                assert t["num_frames"] == 0 and t["confidence"] is None
                kinds.append(("too_long", shard, j))
    assert kinds == [("unreadable", 1, 3), ("too_long", 2, 1)]
    s = reader.summary
    assert s["num_records"] == 26 and s["num_labelled"] == 24
    assert s["missing"]["by_kind"] == {"unreadable": 1, "too_long": 1}
    # Reported on the console with the reason, and the throughput and size figures.
    assert "train-00001-of-00003.array_record[3] '': unreadable: corrupt record" in reference[1]
    assert "'joined-0001': too_long" in reference[1]
    assert s["full_posterior_bytes"] == s["frames"] * 30 * 2 > 0
    assert s["record_bytes"] < s["full_posterior_bytes"] and s["audio_hours"] > 0
    assert s["throughput"]["invocation"]["audio_hours_per_second"] > 0
    print(
        f"\nthroughput {s['throughput']['invocation']['audio_hours_per_second']:.5f} h/s "
        f"({s['throughput']['invocation']['real_time_factor']:.1f} x real time), "
        f"{s['bytes_per_audio_hour']:.0f} file bytes/h, {s['record_bytes_per_audio_hour']:.0f} "
        f"record bytes/h, full posteriors / records {s['full_posterior_ratio_records']:.2f}"
    )


# ---------------------------------------------------------------- multi-host, restarts
def test_two_processes_write_the_same_shards_as_one(data, tiny_run, reference, tmp_path):  # noqa: F811
    out = tmp_path / "out"
    launch = ["jaxspeech.launch_local", "--num_processes=2", "--devices_per_process=1"]
    proc = run_module(*launch, "--module=jaxspeech.teach", "--", *job_args(tiny_run[0], data, out))
    assert "[p1] targets: process 1 of 2: labelled 1 of its 1 shard(s)" in proc.stdout
    assert "[p0] targets: process 0 of 2: labelled 2 of its 2 shard(s)" in proc.stdout
    markers = [
        json.loads((out / SPLIT / (trecords.targets_name(i, SHARDS) + ".done.json")).read_text())
        for i in range(SHARDS)
    ]
    assert [m["process"] for m in markers] == [0, 1, 0]  # shard i on process i % 2
    _same_files(reference[0] / SPLIT, out / SPLIT)
    summary = json.loads((out / SPLIT / trecords.SUMMARY_FILE).read_text())
    assert summary["throughput"]["invocation"]["processes"] == 2
    assert summary["num_records"] == 26


def test_a_stopped_job_resumes_and_writes_the_same_bytes(resumed, reference):
    root, info = resumed
    out = root / "out" / SPLIT
    assert "1 of 3 shards complete; run the same command again" in info["first"]
    assert not info["summary_after_first"]  # targets.json only once every shard is done
    assert "labelled 2 of its 3 shard(s) (1 already complete)" in info["second"]
    shard0 = out / trecords.targets_name(0, SHARDS)
    assert _stat(shard0) == info["stats"]["shard"]  # the complete shard was not rewritten
    assert _stat(f"{shard0}{trecords.DONE_SUFFIX}") == info["stats"]["marker"]
    assert not [n for n in os.listdir(out) if n.endswith(trecords.TEMP_SUFFIX)]
    _same_files(reference[0] / SPLIT, out)  # redone from scratch, as if never stopped
    marker = json.loads((out / (trecords.targets_name(1, SHARDS) + ".done.json")).read_text())
    assert marker["records"] == marker["source_records"] == 9
    assert marker["bytes"] == os.path.getsize(out / trecords.targets_name(1, SHARDS))


# ---------------------------------------------------------------- pseudo-labels
def test_pseudo_label_split_keeps_the_confident_and_trains(data, reference, resumed, tmp_path):
    root, info = resumed
    pdir, threshold = root / "pseudo", info["threshold"]
    targets = _targets(reference[0])
    index = records.read_split_index(str(data), SPLIT)
    source = reader_lib.RecordReader(index.shard_paths, index.shard_num_records)
    kept, dropped = [], {"missing": 0, "empty_transcript": 0, "low_confidence": 0}
    for position, t in enumerate(targets):
        if t["missing"] is not None:
            dropped["missing"] += 1
        elif not normalize_text(t["transcript"]):
            dropped["empty_transcript"] += 1
        elif t["confidence"] < threshold:
            dropped["low_confidence"] += 1
        else:
            kept.append(position)
    assert kept and dropped["low_confidence"] and dropped["missing"] == 2
    report = json.loads((pdir / SPLIT / "pseudo_labels.json").read_text())
    assert report["num_kept"] == len(kept) and report["dropped"] == dropped
    assert f"kept {len(kept)} of 26" in info["second"]

    got = reader_lib.read_split_records(str(pdir), SPLIT)
    raw, _, _ = source.read(kept)
    assert [g["id"] for g in got] == [targets[p]["id"] for p in kept]
    for g, p, r in zip(got, kept, raw):
        assert g["text"] == targets[p]["transcript"]  # the teacher's transcript
        np.testing.assert_array_equal(g["audio"], records.decode_record(r)["audio"])
    pidx = records.read_split_index(str(pdir), SPLIT)
    assert len(pidx.shard_paths) == SHARDS
    np.testing.assert_array_equal(pidx.durations, index.durations[kept])
    assert Tokenizer.load(str(pdir / "tokenizer")) == Tokenizer.load(str(data / "tokenizer"))
    stats = (pdir / SPLIT / "stats.json").read_text()
    assert stats == (data / SPLIT / "stats.json").read_text()

    spec = pipeline_lib.make_bucket_spec((3.0, 6.5), 24.0, 30.0, 16000)
    pipe = pipeline_lib.make_pipeline(
        data_dir=str(pdir), split=SPLIT, tokenizer_dir=str(pdir / "tokenizer"), spec=spec,
        seed=0, train=False,
    )  # fmt: skip
    ids = [i for batch in pipe.dataset() for i in batch["id"] if i]
    assert sorted(ids) == sorted(targets[p]["id"] for p in kept)

    run = tmp_path / "student"
    train = run_module("jaxspeech.train", *tiny_train_args(run, pdir, "--config.train.num_steps=2"))
    steps = [json.loads(line)["step"] for line in open(run / "metrics.jsonl")]
    assert steps[-1] == 2, train.stdout[-2000:]


# ---------------------------------------------------------------- user errors
@pytest.mark.parametrize(
    # The command line's two ways to fail: a request the job refuses (a UserError: every
    # other such check is in process, below) and a flag combination `main` refuses.
    "extra, message",
    [
        ("--top_k=31", "--top_k must be in [1, 30]"),
        ("--min_confidence=0.5", "--min_confidence needs --pseudo_labels"),
    ],
)
def test_user_errors_are_one_clear_line(data, tiny_run, tmp_path, extra, message):  # noqa: F811
    args = job_args(tiny_run[0], data, tmp_path / "out") + [extra]
    proc = run_module("jaxspeech.teach", *args, check=False)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert message in proc.stderr and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith("error: ")


def test_requests_that_cannot_run_are_refused(data, tiny_run, tmp_path):  # noqa: F811
    nostats, rate = tmp_path / "nostats", tmp_path / "rate"
    for copy in (nostats, rate):
        shutil.copytree(data, copy)
    os.remove(nostats / SPLIT / "stats.json")
    index = json.loads((rate / SPLIT / "index.json").read_text())
    (rate / SPLIT / "index.json").write_text(json.dumps(index | {"sample_rate": 8000}))
    no_assets = tmp_path / "no_assets"
    no_assets.mkdir()
    shutil.copy(tiny_run[0] / "config.json", no_assets)
    (tmp_path / "blocker").write_text("a file where the output directory should be")
    # A transducer-only run: the head check reads the run's config alone (a real RNN-T
    # run differs from this one in nothing else that is read before it).
    rnnt = tmp_path / "rnnt"
    rnnt.mkdir()
    config = json.loads((tiny_run[0] / "config.json").read_text())
    config["model"]["head"] = "rnnt"
    (rnnt / "config.json").write_text(json.dumps(config))
    pdir = str(tmp_path / "pseudo")
    cases = [
        ({"teacher": str(tmp_path / "none")}, "not a jaxspeech run directory"),
        ({"teacher": str(rnnt)}, "needs a CTC head"),
        ({"split": "nope"}, "no prepared split at"),
        ({"teacher": str(no_assets)}, "tokenizer cannot be read"),
        ({"data": str(rate)}, "is at 8000 Hz, the teacher at 16000 Hz"),
        ({"output": str(data)}, "must not be the data directory"),
        ({"output": str(tmp_path / "blocker")}, "cannot create"),
        ({"top_k": 0}, "--top_k must be in [1, 30]"),
        ({"batch_seconds": 0.0}, "--batch_seconds must be positive"),
        ({"max_shards": 0}, "--max_shards must be >= 1"),
        ({"pseudo_dir": str(tmp_path / "out")}, "another directory than --output"),
        ({"pseudo_dir": pdir, "min_confidence": 1.5}, "--min_confidence must be in [0, 1]"),
        ({"pseudo_dir": pdir, "data": str(nostats)}, "stats.json not found"),
    ]
    ok = job_lib.Request(str(tiny_run[0]), str(data), SPLIT, K, str(tmp_path / "out"))
    job_lib.check_request(dataclasses.replace(ok, pseudo_dir=pdir))
    for change, message in cases:
        with pytest.raises(UserError) as e:
            job_lib.check_request(dataclasses.replace(ok, **change))
        assert message in str(e.value), (change, str(e.value))


def test_a_rerun_keeps_matching_shards_and_refuses_another_jobs(
    data,
    tiny_run,  # noqa: F811
    reference,
    tmp_path,
):
    out = tmp_path / "out"
    shutil.copytree(reference[0], out)
    req = job_lib.Request(str(tiny_run[0]), str(data), SPLIT, K, str(out))
    # In this process: 8 devices, so other batch shapes than the reference's one device;
    # its shards still count as this job's (the numbers differ by float rounding only).
    job = job_lib.load_job(req, *job_lib.check_request(req))
    assert job.spec.batch_sizes == (8, 8)
    assert all(job_lib.complete_marker(job, s) is not None for s in range(SHARDS))
    # Pseudo-labels asked for now, but not made then: every shard is redone.
    with_pseudo = dataclasses.replace(req, pseudo_dir=str(tmp_path / "pseudo"))
    assert job_lib.complete_marker(dataclasses.replace(job, req=with_pseudo), 0) is None
    # A shard that is not what its marker says (here one byte longer) is redone.
    with open(out / SPLIT / trecords.targets_name(1, SHARDS), "ab") as f:
        f.write(b"x")
    assert job_lib.complete_marker(job, 1) is None
    # Another K into the same directory: refused, never mixed in.
    other = dataclasses.replace(job, req=dataclasses.replace(req, top_k=K + 1))
    with pytest.raises(UserError, match="holds the targets of another job"):
        job_lib.complete_marker(other, 0)
