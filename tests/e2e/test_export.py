"""`python -m jaxspeech.export` on the shared tiny run: the artifact, its manifest and its
dev scores against `jaxspeech.evaluate`; the user's mistakes, one clear error each."""

import json
import shutil

import jax
import numpy as np
import pytest

from jaxspeech import evaluate, export
from jaxspeech.data import records
from jaxspeech.data.reader import RecordReader
from jaxspeech.data.tokenizer import Tokenizer, normalize_text
from jaxspeech.decoding import ctc as ctc_decoding
from jaxspeech.errors import UserError
from jaxspeech.metrics.wer import ErrorCounts
from tests.e2e.cli import run_module


@pytest.fixture(scope="module")
def artifact(tiny_run, corpus, tmp_path_factory):
    """The tiny run exported by the command line: (directory, manifest, stdout line)."""
    workdir, _ = tiny_run
    _, shards = corpus
    out = tmp_path_factory.mktemp("export") / "artifact"
    proc = run_module(
        "jaxspeech.export", "--workdir", str(workdir), "--output", str(out), "--data", str(shards)
    )
    manifest = json.loads((out / export.MANIFEST).read_text())
    return out, manifest, json.loads(proc.stdout.strip().splitlines()[-1])


def test_manifest_describes_the_run_and_scores_like_evaluate(artifact, tiny_run):
    out, manifest, printed = artifact
    workdir, _ = tiny_run
    assert printed["step"] == manifest["run"]["step"] == 8 and printed["functions"] == ["ctc"]
    assert manifest["format"] == "stablehlo" and manifest["audio"]["sample_rate"] == 16000
    assert manifest["audio"]["min_samples"] == 1600
    run_config = json.loads((workdir / "config.json").read_text())
    assert manifest["run"]["config"]["model"] == run_config["model"]
    assert manifest["features"]["num_mel_bins"] == run_config["features"]["num_mel_bins"]
    # The fingerprint is the one the checkpoint was saved with.
    meta = json.loads((workdir / "checkpoints" / "8" / "meta" / "metadata").read_text())
    assert manifest["run"]["params_fingerprint"] == meta["params_fingerprint"]
    # Dev scores of the exported step = what training's evaluation wrote for it.
    want = json.loads((workdir / "eval" / "dev-step8.json").read_text())
    assert manifest["eval"]["split"] == "dev" and manifest["eval"]["num_utts"] == want["num_utts"]
    assert (manifest["eval"]["wer"], manifest["eval"]["cer"]) == (want["wer"], want["cer"])
    # The tokenizer travels with the artifact and loads from there.
    tok = Tokenizer.load(str(out / manifest["tokenizer"]["dir"]))
    assert tok.vocab_size == manifest["tokenizer"]["vocab_size"]
    assert manifest["tokenizer"]["blank_id"] == tok.blank_id == 0


def test_artifact_decodes_the_test_split_like_evaluate(artifact, tiny_run, corpus):
    """Greedy decoding of the artifact's log-probs over every test utterance (read with
    the project's reader, all in one padded batch) gives the evaluator's CER."""
    out, manifest, _ = artifact
    workdir, _ = tiny_run
    _, shards = corpus
    exp = jax.export.deserialize((out / manifest["functions"]["ctc"]["file"]).read_bytes())
    tok = Tokenizer.load(str(out / "tokenizer"))
    index = records.read_split_index(str(shards), "test")
    data, faults, _ = RecordReader(index.shard_paths, index.shard_num_records).read(
        range(index.num_records)
    )
    assert not faults
    recs = [records.decode_record(d) for d in data]
    # One batch of every utterance, zero-padded, with the true lengths: one compilation.
    audio = np.zeros((len(recs), max(len(r["audio"]) for r in recs)), np.float32)
    for i, r in enumerate(recs):
        audio[i, : len(r["audio"])] = r["audio"] / 32768.0  # as the loader scales
    lengths = np.array([len(r["audio"]) for r in recs], np.int32)
    logp, n = exp.call(audio, lengths)
    ids = ctc_decoding.collapse(np.argmax(np.asarray(logp), -1), np.asarray(n))
    counts = ErrorCounts()
    for r, hyp in zip(recs, ids, strict=True):
        counts.add(normalize_text(r["text"]), tok.decode(hyp))
    want = evaluate.evaluate_workdir(str(workdir), str(shards), "test", 8)
    assert counts.utterances == want["num_utts"]
    assert counts.cer == pytest.approx(want["cer"], abs=1e-5)


def test_user_mistakes_are_one_clear_error_each(tiny_run, corpus, tmp_path):
    workdir, _ = tiny_run
    _, shards = corpus
    with pytest.raises(UserError, match="unknown export format 'tflite'"):
        export.export_run(str(workdir), str(tmp_path / "a"), fmt="tflite")
    bare = tmp_path / "no_checkpoints"
    shutil.copytree(workdir, bare, ignore=shutil.ignore_patterns("checkpoints"))
    with pytest.raises(UserError, match="checkpoints"):
        export.export_run(str(bare), str(tmp_path / "b"), eval_split="")
    with pytest.raises(UserError, match="no_such_split"):
        export.export_run(str(workdir), str(tmp_path / "c"), data_dir=str(shards),
                          eval_split="no_such_split")  # fmt: skip
    with pytest.raises(UserError, match="not a jaxspeech run directory"):
        export.export_run(str(tmp_path), str(tmp_path / "d"))
