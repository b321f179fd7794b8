"""`python -m jaxspeech.export` on the shared tiny run: the StableHLO artifact, its
manifest and its dev scores against `jaxspeech.evaluate`; the ONNX artifact with int8
through the runtime-only transcriber (examples/transcribe_onnx.py) against the same;
the user's mistakes, one clear error each."""

import json
import pathlib
import shutil
import subprocess
import sys

import jax
import numpy as np
import pytest

from jaxspeech.common.errors import UserError
from jaxspeech.data import reader
from jaxspeech.data.tokenizer import Tokenizer, normalize_text
from jaxspeech.decoding import ctc as ctc_decoding
from jaxspeech.evaluation import run as eval_run
from jaxspeech.metrics.wer import ErrorCounts
from jaxspeech.serving import recognizer_export as export_lib
from tests.conftest import onnx_converter
from tests.e2e.cli import run_module

ROOT = pathlib.Path(__file__).resolve().parents[2]
TRANSCRIBER = str(ROOT / "examples" / "transcribe_onnx.py")


@pytest.fixture(scope="module")
def artifact(tiny_run, corpus, tmp_path_factory):
    """The tiny run exported by the command line: (directory, manifest, stdout line)."""
    workdir, _ = tiny_run
    _, shards = corpus
    out = tmp_path_factory.mktemp("export") / "artifact"
    proc = run_module(
        "jaxspeech.export", "--workdir", str(workdir), "--output", str(out), "--data", str(shards)
    )
    manifest = json.loads((out / export_lib.MANIFEST).read_text())
    return out, manifest, json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def evaluated_test(tiny_run, corpus) -> dict:
    """The evaluator's scores of the tiny run's step 8 on the test split (both artifact
    formats are checked against them)."""
    workdir, _ = tiny_run
    _, shards = corpus
    return eval_run.evaluate_workdir(str(workdir), str(shards), "test", 8)


def test_manifest_describes_the_run_and_scores_like_evaluate(artifact, tiny_run):
    out, manifest, printed = artifact
    workdir, _ = tiny_run
    assert printed["step"] == manifest["run"]["step"] == 8 and printed["functions"] == ["ctc"]
    assert manifest["format"] == "stablehlo" and manifest["audio"]["sample_rate"] == 16000
    assert manifest["audio"]["min_samples"] == 1600
    run_config = json.loads((workdir / "config.json").read_text())
    # The artifact's attention is XLA's whatever the run's: cuDNN's lowers for CUDA only.
    run_config["model"]["conformer"]["attention"] = "xla"
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


def _stablehlo_texts(artifact, recs) -> list[str]:
    out, manifest, _ = artifact
    exp = jax.export.deserialize((out / manifest["functions"]["ctc"]["file"]).read_bytes())
    tok = Tokenizer.load(str(out / "tokenizer"))
    # One batch of every utterance, zero-padded, with the true lengths: one compilation.
    audio = np.zeros((len(recs), max(len(r["audio"]) for r in recs)), np.float32)
    for i, r in enumerate(recs):
        audio[i, : len(r["audio"])] = reader.audio_float32(r)
    lengths = np.array([len(r["audio"]) for r in recs], np.int32)
    logp, n = exp.call(audio, lengths)
    ids = ctc_decoding.collapse(np.argmax(np.asarray(logp), -1), np.asarray(n))
    return [tok.decode(hyp) for hyp in ids]


def test_artifact_decodes_the_test_split_like_evaluate(artifact, corpus, evaluated_test):
    """Greedy decoding of the artifact's log-probs over every test utterance (read with
    the project's reader, all in one padded batch) gives the evaluator's CER."""
    _, shards = corpus
    recs = reader.read_split_records(str(shards), "test")
    counts = ErrorCounts()
    for r, hyp in zip(recs, _stablehlo_texts(artifact, recs), strict=True):
        counts.add(normalize_text(r["text"]), hyp)
    assert counts.utterances == evaluated_test["num_utts"]
    assert counts.cer == pytest.approx(evaluated_test["cer"], abs=1e-5)


def test_onnx_int8_export_and_the_runtime_only_transcriber(
    artifact, tiny_run, corpus, evaluated_test, tmp_path
):
    """`--format onnx --int8`: the manifest and quantization.json; the transcriber, in a
    process that imports neither jax nor jaxspeech, reads the test split as wav files and
    prints the StableHLO artifact's greedy text for every one (float32), so the
    evaluator's CER; int8 decodes them too."""
    import soundfile as sf

    workdir, _ = tiny_run
    _, shards = corpus
    out = tmp_path / "onnx"
    run_module(
        "jaxspeech.export", "--workdir", str(workdir), "--output", str(out), "--format", "onnx",
        "--int8", "--calibration", f"{shards}:train", "--calibration_utts", "4",
        "--eval_split", "", "--onnx_python", onnx_converter(),
    )  # fmt: skip
    manifest = json.loads((out / export_lib.MANIFEST).read_text())
    assert manifest["format"] == "onnx" and manifest["quantization"] == "quantization.json"
    ctc = manifest["functions"]["ctc"]
    assert (ctc["file"], ctc["int8_file"]) == ("ctc.onnx", "ctc.int8.onnx")
    assert [i["shape"] for i in ctc["inputs"]] == [["b", "s"], ["b"]]
    assert ctc["max_abs_diff_vs_jax"] < 1e-4
    quant = json.loads((out / "quantization.json").read_text())
    assert quant["method"] == "minmax" and quant["calibration"]["split"] == "train"
    assert quant["calibration"]["num_utts"] == 4 and len(quant["calibration"]["id"]) == 16
    assert quant["functions"]["ctc"]["weights"]
    recs = reader.read_split_records(str(shards), "test")
    wavs = []
    for i, r in enumerate(recs):
        wavs.append(str(tmp_path / f"utt{i}.wav"))
        sf.write(wavs[-1], np.asarray(r["audio"]), r["sample_rate"], subtype="PCM_16")
    script = (
        "import json, runpy, sys\n"
        "sys.argv = sys.argv[1:]\n"
        "try:\n"
        "    runpy.run_path(sys.argv[0], run_name='__main__')\n"
        "finally:\n"
        "    mods = ('jax', 'jaxspeech', 'flax')\n"
        "    print(json.dumps(sorted(m for m in mods if m in sys.modules)), file=sys.stderr)\n"
    )
    texts = {}
    for int8 in (False, True):
        cmd = [sys.executable, "-c", script, TRANSCRIBER, "--artifact", str(out)]
        proc = subprocess.run(
            cmd + ["--int8"] * int8 + wavs, capture_output=True, text=True, check=False
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert json.loads(proc.stderr.strip().splitlines()[-1]) == []
        lines = [line.split("\t") for line in proc.stdout.strip("\n").split("\n")]
        assert [p for p, _ in lines] == wavs
        texts[int8] = [t for _, t in lines]
    assert texts[False] == _stablehlo_texts(artifact, recs)
    counts = ErrorCounts()
    for r, hyp in zip(recs, texts[False], strict=True):
        counts.add(normalize_text(r["text"]), hyp)
    assert counts.cer == pytest.approx(evaluated_test["cer"], abs=1e-5)
    assert len(texts[True]) == len(recs)


def test_user_mistakes_are_one_clear_error_each(tiny_run, corpus, tmp_path):
    workdir, _ = tiny_run
    _, shards = corpus
    with pytest.raises(UserError, match="unknown export format 'tflite'"):
        export_lib.export_run(str(workdir), str(tmp_path / "a"), fmt="tflite")
    bare = tmp_path / "no_checkpoints"
    shutil.copytree(workdir, bare, ignore=shutil.ignore_patterns("checkpoints"))
    with pytest.raises(UserError, match="checkpoints"):
        export_lib.export_run(str(bare), str(tmp_path / "b"), eval_split="")
    with pytest.raises(UserError, match="no_such_split"):
        export_lib.export_run(str(workdir), str(tmp_path / "c"), data_dir=str(shards),
                          eval_split="no_such_split")  # fmt: skip
    with pytest.raises(UserError, match="not a jaxspeech run directory"):
        export_lib.export_run(str(tmp_path), str(tmp_path / "d"))
    with pytest.raises(UserError, match="--int8 needs --format onnx"):
        export_lib.export_run(str(workdir), str(tmp_path / "e"), int8=True)
    with pytest.raises(UserError, match="--int8 needs --calibration DATA_DIR:SPLIT"):
        export_lib.export_run(str(workdir), str(tmp_path / "f"), fmt="onnx", int8=True)
    with pytest.raises(UserError, match="calibration split: no prepared split .*no_such"):
        export_lib.export_run(str(workdir), str(tmp_path / "g"), fmt="onnx", int8=True,
                          calibration=f"{shards}:no_such")  # fmt: skip
    with pytest.raises(UserError, match="unknown calibration method 'kl'"):
        export_lib.export_run(str(workdir), str(tmp_path / "h"), fmt="onnx", int8=True,
                          calibration=f"{shards}:dev", calibration_method="kl")  # fmt: skip
    with pytest.raises(UserError, match="ONNX converter's environment is missing"):
        export_lib.export_run(str(workdir), str(tmp_path / "i"), fmt="onnx", eval_split="",
                          onnx_python=str(tmp_path / "no_python"))  # fmt: skip
