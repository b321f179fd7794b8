"""`python -m jaxspeech.export` on a synthesizer's run (jaxspeech/tts/artifact.py) on
the session's tiny run (tests/tts/conftest.py; read, never changed): the StableHLO and
ONNX artifacts against the model's own `synthesize` in process at two (B, N) (symbolic
batch and phoneme length), the manifest, a max_frames too small for the speech (the mask
and the truncation flag), and the recognizer's flags refused in one line."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxspeech.common.errors import UserError
from jaxspeech.serving import artifact_dir, staging
from jaxspeech.tts import artifact as tts_export
from jaxspeech.tts.loading import denormalized
from tests.conftest import onnx_converter
from tests.e2e.cli import run_module

# Exported vs in process, log-mel in nats (values -14..5): the same float32 computation
# compiled for symbolic shapes (StableHLO) or by onnxruntime's kernels (ONNX) differs by
# rounding only (measured up to 6e-6 and 9e-6); durations and masks are equal exactly.
ATOL = {"stablehlo": 1e-4, "onnx": staging.ONNX_TOLERANCE}
SHAPES = [(2, 7, 0), (3, 19, 1)]  # (B, N, seed): two batch sizes and phoneme lengths


@pytest.fixture(scope="module")
def loaded(tts_tiny_run):
    """The tiny run on one device, as the export loads it."""
    run_dir, _ = tts_tiny_run
    return tts_export.load_run(str(run_dir))


_SYNTHESIZE: dict = {}


def reference(run, feeds: dict, max_frames: int) -> tuple:
    """The model's `synthesize` in process (padding past phoneme_len as id 0), each row's
    valid frames denormalized as the evaluation does: ([(T_b, M) log-mel], (B, T) mask,
    (B, N) durations). One jit per max_frames for the module: the StableHLO and ONNX
    tests share its compilations."""
    if max_frames not in _SYNTHESIZE:

        @jax.jit
        def synthesize(params, tokens, speaker, scale):
            model = nnx.merge(run.spec.graphdef, params)
            return model.synthesize(tokens, speaker, max_frames, duration_scale=scale[:, None])

        _SYNTHESIZE[max_frames] = synthesize
    phonemes, lengths = feeds["phonemes"], feeds["phoneme_len"]
    tokens = np.where(np.arange(phonemes.shape[1])[None] < lengths[:, None], phonemes, 0)
    mel, mask, durations = jax.device_get(
        _SYNTHESIZE[max_frames](
            run.params, tokens, feeds["speaker"], jnp.asarray(feeds["duration_scale"])
        )
    )
    mels = [denormalized(m[: int(k.sum())], run.model_vars) for m, k in zip(mel, mask)]
    return mels, mask, durations


def check_against_reference(got: list, run, feeds: dict, max_frames: int, atol: float) -> float:
    """Exported (log_mel, frame_mask, durations, truncated) vs `reference`; returns the
    largest log-mel difference on valid frames."""
    log_mel, mask, durations, truncated = (np.asarray(x) for x in got)
    want_mels, want_mask, want_durations = reference(run, feeds, max_frames)
    np.testing.assert_array_equal(durations, want_durations)
    np.testing.assert_array_equal(mask, want_mask)
    np.testing.assert_array_equal(truncated, want_durations.sum(1) > max_frames)
    diff = 0.0
    for row, want in enumerate(want_mels):
        n = len(want)
        np.testing.assert_allclose(log_mel[row, :n], want, atol=atol, rtol=0)
        diff = max(diff, float(np.abs(log_mel[row, :n] - want).max()))
        silence = np.log(run.config.features.log_floor)  # past the end: the front end's silence
        np.testing.assert_allclose(log_mel[row, n:], silence, rtol=1e-6)
    return diff


def _inputs(run, b: int, n: int, seed: int) -> dict:
    assets = run.assets
    feeds = tts_export.check_inputs(assets.table.size, len(assets.speakers), b, n, seed)
    feeds["phonemes"][0, feeds["phoneme_len"][0] :] = 5  # junk past the length: ignored
    return feeds


@pytest.fixture(scope="module")
def stablehlo_artifact(tts_tiny_run, tmp_path_factory):
    """The default export, in process (the command line: test_onnx_matches_the_model):
    (directory, manifest)."""
    out = tmp_path_factory.mktemp("tts-export") / "artifact"
    return out, tts_export.export_tts_run(str(tts_tiny_run[0]), str(out))


def test_manifest(stablehlo_artifact, loaded, tts_tiny_run):
    out, manifest = stablehlo_artifact
    run = loaded
    assert manifest["run"]["step"] == run.step and manifest["format"] == "stablehlo"
    assert manifest["task"] == "tts" and manifest["format_version"] == 1
    assert manifest["files"] == ["acoustic.stablehlo", "manifest.json"]
    assert sorted(p.name for p in out.iterdir()) == manifest["files"]
    # Default: twice the longest training utterance (configs/tts.py:tiny, 2 s), by 64.
    assert manifest["max_frames"] == 448 and manifest["max_frames_source"].startswith("default")
    assert manifest["phonemes"]["table"] == list(run.assets.table.tokens)
    speakers = manifest["speakers"]["table"]
    assert [run.assets.speakers[s] for s in speakers] == list(range(len(speakers)))
    assert (manifest["audio"]["sample_rate"], manifest["hop_length"]) == (16000, 160)
    assert manifest["n_mels"] == 80 == len(manifest["features"]["mean"])
    np.testing.assert_allclose(manifest["features"]["std"], run.assets.std, rtol=1e-6)
    assert manifest["vocoder"] is None and manifest["griffin_lim"]["n_iter"] == 64
    assert manifest["griffin_lim"]["hop_length"] == 160
    fn = manifest["functions"]["acoustic"]
    assert [i["shape"] for i in fn["inputs"]] == [["b", "n"], ["b"], ["b"], ["b"]]
    assert [o["name"] for o in fn["outputs"]] == [
        "log_mel",
        "frame_mask",
        "durations",
        "truncated",
    ]
    assert fn["outputs"][0]["shape"] == ["b", "448", "80"]
    meta = tts_tiny_run[0] / "checkpoints" / str(run.step) / "meta" / "metadata"
    if meta.exists():  # the fingerprint the checkpoint was saved with
        fingerprint = json.loads(meta.read_text())["params_fingerprint"]
        assert manifest["run"]["params_fingerprint"] == fingerprint


@pytest.mark.parametrize("b,n,seed", SHAPES)
def test_stablehlo_matches_the_model(stablehlo_artifact, loaded, b, n, seed):
    out, manifest = stablehlo_artifact
    exp = jax.export.deserialize((out / "acoustic.stablehlo").read_bytes())
    feeds = _inputs(loaded, b, n, seed)
    got = exp.call(*feeds.values())
    check_against_reference(got, loaded, feeds, manifest["max_frames"], ATOL["stablehlo"])


def test_max_frames_too_small_masks_and_flags(tts_tiny_run, loaded, tmp_path):
    """Speech longer than max_frames is cut there: its mask is all true, `truncated` says
    so, and rows that fit keep their own length."""
    out = tmp_path / "small"
    manifest = tts_export.export_tts_run(str(tts_tiny_run[0]), str(out), max_frames=16)
    assert manifest["max_frames"] == 16 and manifest["max_frames_source"] == "--max_frames"
    exp = jax.export.deserialize((out / "acoustic.stablehlo").read_bytes())
    feeds = _inputs(loaded, 3, 20, 2)  # >= 1 frame per phoneme: the full row needs > 16
    got = [np.asarray(x) for x in exp.call(*feeds.values())]
    _, mask, durations, truncated = got
    assert truncated[-1] and mask[-1].all()
    np.testing.assert_array_equal(mask.sum(1), np.minimum(durations.sum(1), 16))
    check_against_reference(got, loaded, feeds, 16, ATOL["stablehlo"])


def test_onnx_matches_the_model(tts_tiny_run, loaded, tmp_path):
    """The command line's ONNX export (the converter's environment) in onnxruntime."""
    python = onnx_converter()  # skipped without the converter, failed under make test
    run_dir, out = str(tts_tiny_run[0]), tmp_path / "onnx"
    args = ("--workdir", run_dir, "--output", str(out), "--format", "onnx")
    proc = run_module("jaxspeech.export", *args, "--onnx_python", python)
    printed = json.loads(proc.stdout.strip().splitlines()[-1])
    manifest = json.loads((out / artifact_dir.MANIFEST).read_text())
    assert printed["task"] == "tts" and printed["step"] == manifest["run"]["step"]
    assert printed["max_frames"] == manifest["max_frames"] == 448
    assert (
        manifest["files"]
        == sorted(p.name for p in out.iterdir())
        == [
            "acoustic.onnx",
            "manifest.json",
        ]
    )
    import onnxruntime as ort

    fn = manifest["functions"]["acoustic"]
    assert fn["max_abs_diff_vs_jax"] <= staging.ONNX_TOLERANCE and fn["dtype"] == "float32"
    session = ort.InferenceSession(str(out / fn["file"]), providers=["CPUExecutionProvider"])
    for b, n, seed in SHAPES:
        feeds = _inputs(loaded, b, n, seed)
        got = session.run(None, feeds)
        check_against_reference(got, loaded, feeds, manifest["max_frames"], ATOL["onnx"])
    # Ids outside the tables, no phonemes, a NaN scale: clamped (tts.acoustic), never NaN.
    speakers = len(loaded.assets.speakers)
    bad = {
        "phonemes": np.array([[2, 3, 4, 5]] * 4 + [[2, 10**6, -5, 3]], np.int32),
        "phoneme_len": np.array([4, 4, 4, 0, 4], np.int32),
        "speaker": np.array([speakers - 1, speakers, -1, 0, 0], np.int32),
        "duration_scale": np.array([1, 1, np.nan, 1, 1], np.float32),
    }
    log_mel, mask, durations, _ = session.run(None, bad)
    assert np.isfinite(log_mel).all() and not mask[3].any()
    np.testing.assert_array_equal(durations[1], durations[0])  # speaker S -> S - 1
    # `python -m jaxspeech.synthesize --artifact` runs the ONNX function as the run's.
    from jaxspeech.tts import synthesis

    sentence = [synthesis.Sentence(1, "_ a m _", "_ a m _", ["_", "a", "m", "_"])]
    exported, in_process = (
        synthesis.spoken_mels(s, sentence, 1, 1.0)[0]
        for s in (synthesis.from_artifact(str(out)), synthesis.from_run(run_dir))
    )
    np.testing.assert_allclose(exported, in_process, atol=ATOL["onnx"])


def test_bad_command_lines(tts_tiny_run, tmp_path):
    run_dir = str(tts_tiny_run[0])
    proc = run_module(
        "jaxspeech.export",
        "--workdir",
        run_dir,
        "--output",
        str(tmp_path / "x"),
        "--int8",
        check=False,
    )
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert lines == [
        f"error: bad command line: --int8: recognizer export only; {run_dir} is a "
        "synthesizer's run (config.task=tts)"
    ]
    assert not (tmp_path / "x").exists()
    with pytest.raises(UserError, match="--max_frames must be >= 1"):
        tts_export.export_tts_run(run_dir, str(tmp_path / "y"), max_frames=0)
    with pytest.raises(UserError, match="unknown export format 'both'"):
        tts_export.export_tts_run(run_dir, str(tmp_path / "y"), fmt="both")
