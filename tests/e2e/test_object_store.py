"""Prepared data on an object store: a real S3 server on 127.0.0.1 (moto's, in a
subprocess; benchmarks/lib/store_servers.py), reached through botocore as any S3 endpoint.

`data_prep.prepare --output s3://...` uploads byte-identical shards (index.json last, the
split's commit marker); `jaxspeech.train` with `data.dir=s3://...` trains and evaluates
exactly as on the local copy (the same losses and dev/test WER as the session's tiny run);
a corrupt object reaches the loader's read-time fault handling, named; an uncommitted
split, a missing bucket and a missing prefix are one line each; a replaced object is
fetched again; transient errors are retried, others are not.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
import time

import numpy as np
import pytest

from benchmarks.lib.store_servers import gcs_env, gcs_server
from data_prep import prepare as prep
from data_prep.readers.common import PrepareError
from jaxspeech.common import storage
from jaxspeech.data import reader as reader_lib
from jaxspeech.data import records
from jaxspeech.runs import checkpoint as ckpt_lib
from jaxspeech.runs import lease as lease_lib
from jaxspeech.runs import remote
from tests.distill.test_targets import SPLIT, data, job_args, reference  # noqa: F401  (fixtures)
from tests.e2e.cli import ROOT, cpu_env, run_module, train_args
from tests.test_launch_local import LineReader

pytestmark = pytest.mark.slow


def _prepare(raw, output, split, *extra) -> dict:
    """The corpus fixture's preparation of `split` (tests/e2e/conftest.py), in process."""
    argv = ["prepare", "--format", "manifest", "--input", str(raw / split / "manifest.jsonl")]
    argv += ["--output", str(output), "--split", split, "--tokenizer", "char", *extra]
    return prep.prepare([*argv, "--direct_running_mode=in_memory", "--direct_num_workers=1"])


@pytest.fixture(scope="module")
def remote_corpus(corpus, store):
    """The e2e corpus prepared onto the store (train, dev, test)."""
    root, _ = corpus
    url = storage.join(store[0], "corpus")
    reports = {split: _prepare(root / "raw", url, split) for split in ("train", "dev", "test")}
    return url, reports


def _objects(url: str) -> dict[str, bytes]:
    fs, path = storage.filesystem(url)
    return {name: fs.cat_file(f"{path}/{name}") for name in storage.list_files(url)}


def test_prepared_shards_on_s3_are_the_local_ones(corpus, remote_corpus):
    _, shards = corpus
    url, reports = remote_corpus
    assert reports["train"]["split_dir"] == f"{url}/train"
    for split in ("train", "dev", "test", "tokenizer"):
        objects = _objects(storage.join(url, split))
        local = sorted(
            os.path.relpath(os.path.join(d, f), shards / split)
            for d, _, names in os.walk(shards / split)
            for f in names
        )
        assert sorted(objects) == local
        for name, blob in objects.items():
            if name == "prep_report.json":  # its paths and elapsed time differ
                assert json.loads(blob)["split_dir"] == f"{url}/{split}"
                continue
            assert blob == (shards / split / name).read_bytes(), (split, name)


def _rows(lines) -> dict[int, dict]:
    """metrics.jsonl by step, the last row of a step (a resumed run logs steps again),
    without timings: what was learned and scored, not how fast."""
    timing = ("per_s", "perf/", "seconds", "_ms")
    out = {}
    for line in lines:
        row = json.loads(line)
        out[row["step"]] = {k: v for k, v in row.items() if not any(t in k for t in timing)}
    return out


def _killed_when_committed(args, env, url: str, step: int) -> None:
    """Starts `jaxspeech.train ARGS`; SIGKILLs it as soon as checkpoint `step` is committed
    on the store (its commit file exists)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "jaxspeech.train", *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    reader = LineReader(proc)
    commit = storage.join(url, "checkpoints", str(step), "commit_success.txt")
    try:
        deadline = time.monotonic() + 300
        while not storage.exists(commit):
            assert proc.poll() is None and time.monotonic() < deadline, reader.text()
            time.sleep(0.05)
    finally:
        proc.kill()
        proc.wait()


def test_train_kill_resume_evaluate_with_data_and_run_on_s3(remote_corpus, store, tiny_run):
    """The session's tiny run (tests/e2e/conftest.py) again with its data and its run
    directory on S3, SIGKILLed once checkpoint 4 is committed there and resumed: the same
    losses and dev/test WER. Then evaluate and status on the store run."""
    url, _ = remote_corpus
    run = storage.join(store[0], "runs", "tiny")
    env = cpu_env() | store[1]
    args = train_args(run, url, "--config.data.eval_split=dev,test")
    _killed_when_committed(args, env, run, 4)
    out = run_module("jaxspeech.train", *args, env=env).stdout
    assert "taking over the lease" in out and "no longer exists" in out  # the killed holder
    fs, path = storage.filesystem(run)
    log = b"".join(
        fs.cat_file(f"{path}/{name}")
        for name in sorted(storage.list_files(run))
        if name.startswith("events.jsonl.parts/")
    )
    resumed = [json.loads(ln) for ln in log.splitlines() if b'"resumed"' in ln]
    assert [e["step"] for e in resumed] in ([4], [8]), resumed
    metrics = b"".join(
        fs.cat_file(f"{path}/{name}")
        for name in sorted(storage.list_files(run))
        if name.startswith("metrics.jsonl.parts/")
    )
    got = _rows(metrics.decode().splitlines())
    want = _rows(open(os.path.join(tiny_run[0], "metrics.jsonl")))
    assert got == want and any("eval/test/wer" in r for r in got.values())
    wer = [re.sub(r", [\d.]+s\)$", "", ln) for ln in out.splitlines() if ln.startswith("eval")]
    assert len(wer) == 2 and all(line in tiny_run[1] for line in wer), (wer, tiny_run[1])
    # The store holds no lease (released), the committed checkpoints and no local paths.
    names = storage.list_files(run)
    assert "lease.json" not in names and "checkpoints/8/commit_success.txt" in names
    assert "config.json" in names and "assets/stats.json" in names

    # evaluate reads the store run (checkpoint from the store) and adds its results there.
    ev = run_module("jaxspeech.evaluate", "--workdir", run, "--split=test", env=env).stdout
    result = json.loads(ev.splitlines()[0])
    assert [result["wer"], result["cer"]] == [got[8]["eval/test/wer"], got[8]["eval/test/cer"]]
    assert any(
        n.startswith("eval/test-step8") and n.endswith(".json") for n in storage.list_files(run)
    )
    st = run_module("jaxspeech.status", run, env=env, check=False)
    assert st.returncode == 0 and st.stdout.startswith("state=finished step=8"), st.stdout


def _corrupt_copy(shards, url: str) -> str:
    """The dev split uploaded under `url` with 4 KiB of its shard's records overwritten;
    returns the shard's name."""
    storage.upload_dir(str(shards / "dev"), storage.join(url, "dev"))
    fs, path = storage.filesystem(url)
    index = json.loads(fs.cat_file(f"{path}/dev/index.json"))
    shard = index["shards"][0]["path"]
    blob = bytearray(fs.cat_file(f"{path}/dev/{shard}"))
    blob[len(blob) // 3 : len(blob) // 3 + 4096] = os.urandom(4096)  # inside the records
    fs.pipe_file(f"{path}/dev/{shard}", bytes(blob))
    return shard


def test_a_corrupt_object_is_named_by_the_readers(corpus, remote_corpus):
    _, shards = corpus
    url = storage.join(remote_corpus[0], "corrupt")
    shard = _corrupt_copy(shards, url)
    with pytest.raises(ValueError, match=rf"unreadable records \(.*{shard}"):
        reader_lib.read_split_records(url, "dev")


def test_verify_checks_a_store_split_read_only(corpus, remote_corpus, capsys):
    from data_prep import verify

    url = remote_corpus[0]
    flags = ["--direct_running_mode=in_memory", "--direct_num_workers=1"]
    assert verify.main([url, "--split", "dev", *flags]) == 0
    out = capsys.readouterr().out
    assert "dev: 1 shards" in out and "0 bad shards" in out, out
    corrupt = storage.join(url, "verify-corrupt")
    shard = _corrupt_copy(corpus[1], corrupt)
    assert verify.main([corrupt, *flags]) == 1
    assert f"{shard}: " in capsys.readouterr().out
    assert verify.main([url, "--split", "dev", "--repair", *flags]) == 2
    assert "--repair rewrites shards in place" in capsys.readouterr().err


def test_store_mistakes_are_one_line(corpus, remote_corpus, tmp_path):
    root, shards = corpus
    url = remote_corpus[0]
    with pytest.raises(PrepareError, match=r"^s3://no-such-bucket/x: no bucket 'no-such-bucket'"):
        _prepare(root / "raw", "s3://no-such-bucket/x", "dev")
    with pytest.raises(storage.StorageError, match="no bucket 'no-such-bucket' on this endpoint"):
        records.read_split_index("s3://no-such-bucket/x", "dev")
    with pytest.raises(storage.StorageError, match="no objects under this prefix"):
        records.read_split_index(url, "nosplit")
    # A split whose index.json is not there (an upload that stopped before its commit).
    half = storage.join(url, "half")
    storage.upload_dir(str(shards / "dev"), storage.join(half, "dev"))
    storage.remove(storage.join(half, "dev", "index.json"))
    with pytest.raises(storage.StorageError, match="no index.json: not prepared, or still being"):
        records.read_split_index(half, "dev")
    # The trainer stops on a missing bucket before it builds anything.
    proc = run_module(
        "jaxspeech.train",
        *train_args(tmp_path / "run", "s3://no-such-bucket/data"),
        env=cpu_env() | {k: v for k, v in os.environ.items() if k.startswith(("AWS_", "JAX"))},
        check=False,
    )
    assert proc.returncode == 2, proc.stderr
    assert (
        proc.stderr.strip()
        .splitlines()[-1]
        .endswith(
            "s3://no-such-bucket/data: no bucket 'no-such-bucket' on this endpoint "
            f"({os.environ['AWS_ENDPOINT_URL']})"
        )
    ), proc.stderr


def test_a_replaced_object_is_fetched_again_and_a_removed_one_leaves_the_mirror(
    corpus, remote_corpus
):
    _, shards = corpus
    url = storage.join(remote_corpus[0], "mirror", "dev")
    storage.upload_dir(str(shards / "dev"), url)
    local = storage.local_dir(url, "index.json")
    fs, path = storage.filesystem(url)
    fs.pipe_file(f"{path}/durations.npy", b"x" * os.path.getsize(f"{local}/durations.npy"))
    fs.rm_file(f"{path}/prep_report.json")
    assert storage.local_dir(url, "index.json") == local
    assert open(f"{local}/durations.npy", "rb").read().startswith(b"xxxx")
    assert not os.path.exists(f"{local}/prep_report.json")


def test_transient_errors_are_retried_and_others_are_not(monkeypatch):
    monkeypatch.setattr(storage, "BACKOFF_S", 0.0)
    calls = []

    def flaky():
        calls.append(1)
        if len(calls) < 3:
            raise ConnectionResetError("connection reset by peer")
        return "ok"

    assert storage.retrying("s3://b/k", flaky) == "ok" and len(calls) == 3
    calls.clear()

    def missing():
        calls.append(1)
        raise FileNotFoundError("b/k")

    with pytest.raises(storage.StorageError, match=r"^s3://b/k: no such object$"):
        storage.retrying("s3://b/k", missing)
    assert len(calls) == 1
    calls.clear()
    with pytest.raises(storage.StorageError, match="ConnectionResetError"):
        storage.retrying("s3://b/k", lambda: calls.append(1) or flaky_forever())
    assert len(calls) == storage.RETRIES + 1


def flaky_forever():
    raise ConnectionResetError("connection reset by peer")


def test_gcs_through_the_same_layer(corpus, tmp_path, monkeypatch):
    """gs:// through gcsfs against gcp-storage-emulator: a split uploaded and read back
    record for record as the local copy, a replaced object fetched again, a missing
    bucket in one line."""
    _, shards = corpus
    with gcs_server() as endpoint:
        for key, value in gcs_env(endpoint, str(tmp_path / "cache")).items():
            monkeypatch.setenv(key, value)
        fs, _ = storage.filesystem("gs://jaxspeech-gcs")
        fs.mkdir("jaxspeech-gcs")
        url = "gs://jaxspeech-gcs/corpus"
        for split in ("dev", "tokenizer"):
            storage.upload_dir(str(shards / split), storage.join(url, split))
        got = reader_lib.read_split_records(url, "dev")
        want = reader_lib.read_split_records(str(shards), "dev")
        assert [r["id"] for r in got] == [r["id"] for r in want]
        for g, w in zip(got, want):
            np.testing.assert_array_equal(g["audio"], w["audio"])
        assert os.path.isdir(os.path.join(storage.local_data(url, "tokenizer"), "tokenizer"))
        fs.pipe_file("jaxspeech-gcs/corpus/dev/prep_report.json", b"{}")
        local = storage.local_dir(storage.join(url, "dev"), "index.json")
        assert open(os.path.join(local, "prep_report.json")).read() == "{}"
        with pytest.raises(storage.StorageError, match="no bucket 'nope-gcs' on this endpoint"):
            records.read_split_index("gs://nope-gcs/corpus", "dev")


def test_distillation_targets_from_s3_data_equal_the_local_ones(  # noqa: F811
    store,
    data,  # noqa: F811
    reference,  # noqa: F811
    tiny_run,
    tmp_path,
):
    """tests/distill/test_targets.py's reference job again, its split read from S3: the
    same target shards, byte for byte; the markers and report name the URL."""
    url = storage.join(store[0], "distill")
    storage.upload_dir(os.path.join(data, SPLIT), storage.join(url, SPLIT))
    out = tmp_path / "targets"
    run_module("jaxspeech.teach", *job_args(tiny_run[0], url, out), env=cpu_env() | store[1])
    want = sorted(os.listdir(reference[0] / SPLIT))
    assert sorted(os.listdir(out / SPLIT)) == want
    for name in want:
        got, ref = (out / SPLIT / name).read_bytes(), (reference[0] / SPLIT / name).read_bytes()
        if name.endswith(".json"):  # they record where the data was, and times
            got, ref = _where_from(json.loads(got), url), _where_from(json.loads(ref), data)
        assert got == ref, name


def _where_from(report: dict, location) -> dict:
    """A targets marker or report with the data's location made relative and its timings
    removed."""
    text = json.dumps(report).replace(os.fspath(location), "DATA")
    report = json.loads(text)
    for key in ("seconds", "throughput"):
        report.pop(key, None)
    for shard in report.get("shards", []):
        shard.pop("seconds", None)
    return report


def test_one_job_per_run_directory_on_s3(store):
    """The run's lease lives on the store: a second job is refused while the first holds
    it, a stale lease (a host that stopped beating) is taken over with a warning, and a
    missing bucket is one line."""
    run = storage.join(store[0], "runs", "leased")
    with lease_lib.hold(run, "train", 60):
        with pytest.raises(lease_lib.LeaseHeld, match=r"is in use by a train job pid \d+ on"):
            with lease_lib.hold(run, "eval", 60):
                pass
        assert lease_lib.lease_state(run)["alive"]
    assert lease_lib.lease_state(run) == {}  # released
    fs, path = storage.filesystem(run)
    stale = {
        "owner": "x",
        "kind": "train",
        "host": "gone",
        "pid": 1,
        "heartbeat": 0,
        "timeout_s": 5,
    }
    fs.pipe_file(f"{path}/lease.json", json.dumps(stale).encode())
    warned = []
    with lease_lib.hold(run, "train", 60, warn=warned.append):
        assert lease_lib.lease_state(run)["alive"]
    assert len(warned) == 1 and "taking over the lease" in warned[0], warned
    with pytest.raises(storage.StorageError, match="no bucket 'nope' on this endpoint"):
        with lease_lib.hold("s3://nope/run", "train", 60):
            pass


def _conditional_write_after_a_read(bucket: str) -> None:
    """What OCDBT does to its manifest when its cached copy is stale, here every time: a
    write conditioned on the generation that tensorstore read (from the headers of the
    object's data, which the bare emulator leaves out: benchmarks/lib/gcs_emulator.py)."""
    import tensorstore as ts

    kv = ts.KvStore.open({"driver": "gcs", "bucket": bucket}).result()
    kv.write("probe", b"1").result()
    read = kv.read("probe").result()
    kv.write("probe", b"2", if_equal=read.stamp.generation).result()
    assert kv.read("probe").result().value == b"2"
    kv.write("probe", None).result()  # deleted


def test_run_directory_layer_on_gcs(tmp_path, monkeypatch):
    """The run-directory layer on the GCS emulator, in process: checkpoints through
    Orbax's own GCS kvstore (a corrupt latest step falls back to the one before and is
    set aside on the store) and a working copy pushed and pulled back."""
    from tests.test_checkpoint import (
        _assert_bitwise,
        _host,
        _iterator,
        _save_small,
        _small,
        _small_abstract,
    )

    with gcs_server() as endpoint:
        for k, v in gcs_env(endpoint, str(tmp_path / "cache")).items():
            monkeypatch.setenv(k, v)
        monkeypatch.delenv("TENSORSTORE_GCS_HTTP_URL", raising=False)
        fs, _ = storage.filesystem("gs://runs-gcs")
        fs.mkdir("runs-gcs")
        run = "gs://runs-gcs/tiny"
        ckpt = ckpt_lib.Checkpointer(run, async_save=False)
        _conditional_write_after_a_read("runs-gcs")
        _save_small(ckpt, 2, 2.0)
        _save_small(ckpt, 4, 4.0)
        assert ckpt.all_steps() == [2, 4] and ckpt.finalized(4)
        data = [n for n in storage.list_files(run) if n.startswith("checkpoints/4/model/")]
        for name in data:
            if "/d/" in name:
                fs.pipe_file(f"runs-gcs/tiny/{name}", b"junk")
        warnings = []
        step, out = ckpt.restore_latest(
            warn=lambda s, m: warnings.append(m),
            abstract_model=_small_abstract(),
            data_iter=_iterator(),
        )
        assert step == 2 and len(warnings) == 1 and "checkpoint 4 is corrupt" in warnings[0]
        _assert_bitwise(out["model"], _host(_small(2.0)))
        names = storage.list_files(run)
        assert any(n.startswith(f"{ckpt_lib.CORRUPT_DIR}/4-") for n in names)
        assert not any(n.startswith("checkpoints/4/") for n in names)
        ckpt.close()

        # The lease is not tried here: the emulator ignores preconditions (ifGenerationMatch=0
        # creates over an existing object); gcsfs turns GCS's 412 into the FileExistsError
        # that runs/lease.py takes for "held", as s3fs does, tested on the S3 server.

        copy = remote.RunCopy(run, str(tmp_path / "copy"))
        copy.pull()
        events_log = os.path.join(copy.local, "events.jsonl")
        with open(events_log, "w") as f:
            f.write('{"event": "started"}\n{"event": "resu')  # a line being written
        with open(os.path.join(copy.local, "config.json"), "w") as f:
            f.write("{}")
        assert copy.push() == 2
        with open(events_log, "a") as f:
            f.write('med"}\n')
        assert copy.push() == 1 and copy.push() == 0
        parts = sorted(n for n in storage.list_files(run) if n.startswith("events.jsonl.parts/"))
        assert parts == [f"events.jsonl.parts/{0:016d}", f"events.jsonl.parts/{21:016d}"]
        again = remote.RunCopy(run, str(tmp_path / "again"))
        again.pull()
        assert open(os.path.join(again.local, "events.jsonl")).read() == open(events_log).read()
        assert open(os.path.join(again.local, "config.json")).read() == "{}"


def test_a_language_model_on_s3_is_read_through_the_cache(store, tmp_path):
    """decoding.lm_path may be a URL: KenLM opens a cached copy, fetched again when the
    object changes; a missing object is one line."""
    from jaxspeech.decoding.lm import NgramLM
    from tests.decoding.test_lm_fusion import ARPA

    url = storage.join(store[0], "lm", "words.arpa")
    fs, path = storage.filesystem(url)
    fs.pipe_file(path, ARPA.encode())
    lm = NgramLM(url)
    local = lm.path
    assert open(local).read() == ARPA and local.startswith(storage.cache_root())
    logp, _ = lm.score(lm.begin(), "ab")
    assert logp == pytest.approx(-0.1 * math.log(10), rel=1e-6)  # the file's <s> ab
    fs.pipe_file(path, ARPA.replace("-0.1\t<s> ab", "-0.4\t<s> ab").encode())  # replaced
    lm = NgramLM(url)
    assert lm.path == local and lm.score(lm.begin(), "ab")[0] == pytest.approx(
        -0.4 * math.log(10), rel=1e-6
    )
    with pytest.raises(storage.StorageError, match="lm/none.arpa: no such object"):
        NgramLM(storage.join(store[0], "lm", "none.arpa"))


def test_logs_are_compacted_by_their_writer_and_read_across_a_compaction(
    store, tmp_path, monkeypatch
):
    """A restarted writer rewrites its logs' many parts as one; a reader that listed the
    parts before that still reads the whole log; appends go on after it; TensorBoard
    files wait for a full push between checkpoints."""
    monkeypatch.setattr(remote, "COMPACT_PARTS", 3)
    run = storage.join(store[0], "runs", "compact")
    first = remote.RunCopy(run, str(tmp_path / "first"))
    first.pull()
    events_log = os.path.join(first.local, "events.jsonl")
    faults_log = os.path.join(first.local, "data_faults", "p1.jsonl")
    os.makedirs(os.path.dirname(faults_log))
    for i in range(5):
        for path in (events_log, faults_log):
            with open(path, "a") as f:
                f.write(json.dumps({"event": "step", "i": i}) + "\n")
        assert first.push() == 2
    want = open(events_log, "rb").read()
    parts = lambda name: sorted(  # noqa: E731
        k for k in storage.list_files(f"{run}/{name}.parts")
    )
    listed = {int(k): len(want) // 5 for k in parts("events.jsonl")}  # equal-size lines
    assert len(listed) == 5 and len(parts("data_faults/p1.jsonl")) == 5

    restarted = remote.RunCopy(run, str(tmp_path / "restarted"))
    restarted.pull()
    assert restarted.compact(0) == 1  # its events; process 1's fault log is not its own
    assert parts("events.jsonl") == [f"{0:016d}"] and len(parts("data_faults/p1.jsonl")) == 5
    reader = remote.RunCopy(run, str(tmp_path / "reader"))
    reader.pull()
    assert open(os.path.join(reader.local, "events.jsonl"), "rb").read() == want
    fs, base = storage.filesystem(run)
    reader._join_parts(fs, base, "events.jsonl", listed)  # listed before: 4 parts gone
    assert open(os.path.join(reader.local, "events.jsonl"), "rb").read() == want

    with open(os.path.join(restarted.local, "events.jsonl"), "a") as f:
        f.write('{"event": "resumed"}\n')
    board = os.path.join(restarted.local, "tensorboard", "events.out.tfevents.1")
    os.makedirs(os.path.dirname(board))
    with open(board, "wb") as f:
        f.write(b"scalars")
    restarted._last_push = 0.0
    restarted._last_slow_push = time.time()
    assert restarted.push_due() == 1  # the events part; TensorBoard waits
    assert parts("events.jsonl") == [f"{0:016d}", f"{len(want):016d}"]
    assert "tensorboard/events.out.tfevents.1" not in storage.list_files(run)
    assert restarted.push() == 1  # a full push (a checkpoint, the end) sends it
    assert "tensorboard/events.out.tfevents.1" in storage.list_files(run)


def test_a_local_run_copied_to_the_store_goes_on_there(store, tmp_path):
    """A run uploaded whole (events.jsonl one object): a writer makes that object its log's
    first part and appends after it; readers see the whole log before and after."""
    run = storage.join(store[0], "runs", "uploaded")
    local = tmp_path / "local"
    local.mkdir()
    (local / "events.jsonl").write_text('{"event": "started"}\n{"event": "finished"}\n')
    (local / "config.json").write_text("{}")
    storage.upload_dir(str(local), run, last=())
    writer = remote.RunCopy(run, str(tmp_path / "writer"))
    writer.pull()
    fs, base = storage.filesystem(run)
    # A first part written by a writer that died before making the object part 0.
    fs.pipe_file(f"{base}/events.jsonl.parts/{43:016d}", b'{"event": "resumed"}\n')
    want = (local / "events.jsonl").read_bytes() + b'{"event": "resumed"}\n'
    reader = remote.RunCopy(run, str(tmp_path / "reader"))
    reader.pull()
    assert (tmp_path / "reader" / "events.jsonl").read_bytes() == want
    restarted = remote.RunCopy(run, str(tmp_path / "restarted"))
    restarted.pull()
    restarted.compact(0)
    names = storage.list_files(run)
    assert "events.jsonl" not in names and f"events.jsonl.parts/{0:016d}" in names
    with open(tmp_path / "restarted" / "events.jsonl", "ab") as f:
        f.write(b'{"event": "started"}\n')
    assert restarted.push() == 1
    again = remote.RunCopy(run, str(tmp_path / "again"))
    again.pull()
    assert (tmp_path / "again" / "events.jsonl").read_bytes() == want + b'{"event": "started"}\n'


def test_keys_from_a_hostile_bucket_stay_inside_the_cache(store, tmp_path, capsys):
    """Keys with '..' (aimed at a file of the user's beside the cache), an absolute key and
    a log part misnamed: a split's mirror and a run's copy write none of them, and the
    mirror's cleanup removes nothing outside it, even when its manifest (written before
    keys were checked) names such a path. One warning line counts and names them."""
    victim = tmp_path / "victim.txt"
    victim.write_text("mine")
    url = storage.join(store[0], "hostile", "train")
    mirror = storage.cache_path(url)
    escape = os.path.relpath(victim, mirror).replace(os.sep, "/")
    assert escape.startswith("../") and storage.cache_root() not in str(victim)
    fs, base = storage.filesystem(url)
    objects = {
        "index.json": b"{}",
        "shards/a.array_record": b"records",
        escape: b"evil",
        "/" + str(tmp_path / "absolute.txt").lstrip("/"): b"evil",
        "a/./b": b"evil",
    }
    for key, blob in objects.items():
        fs.pipe_file(f"{base}/{key}", blob)
    assert set(storage.list_files(url)) == set(objects)  # the server keeps them as given
    os.makedirs(mirror, exist_ok=True)
    meta = storage.list_files(url)[escape]
    with open(os.path.join(mirror, ".store.json"), "w") as f:  # an old mirror's record
        json.dump({escape: {**meta, "etag": "old"}, "../../../gone": meta}, f)
    before = sorted(os.listdir(tmp_path))

    local = storage.local_dir(url, storage.COMMIT_FILE)
    assert open(os.path.join(local, "shards", "a.array_record"), "rb").read() == b"records"
    warning = capsys.readouterr().out
    assert "skipped 3 object(s) whose keys cannot be local paths" in warning
    assert f"{escape!r} (a '..' segment)" in warning
    fs.rm_file(f"{base}/{escape}")  # now stale on the store: the cleanup's turn
    storage.local_dir(url, storage.COMMIT_FILE)
    assert victim.read_text() == "mine" and sorted(os.listdir(tmp_path)) == before
    assert json.load(open(os.path.join(local, ".store.json"))).keys() == {
        "index.json",
        "shards/a.array_record",
    }

    run = storage.join(store[0], "hostile", "run")
    fs, base = storage.filesystem(run)
    copy = tmp_path / "copy"
    for key, blob in {
        "config.json": b"{}",
        f"events.jsonl.parts/{0:016d}": b'{"event": "started"}\n',
        "../victim.txt": b"evil",
        f"../victim.txt.parts/{0:016d}": b"evil",
        "metrics.jsonl.parts/1": b"{}\n",  # before: a KeyError
    }.items():
        fs.pipe_file(f"{base}/{key}", blob)
    remote.RunCopy(run, str(copy)).pull()
    assert (copy / "events.jsonl").read_text() == '{"event": "started"}\n'
    assert sorted(os.listdir(copy)) == ["config.json", "events.jsonl"]
    assert victim.read_text() == "mine" and "skipped 3 object(s)" in capsys.readouterr().out
