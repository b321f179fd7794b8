"""`python -m jaxspeech.export` on a vocoder's run (jaxspeech/vocoder/artifact.py) on
the session's tiny vocoder run (tests/tts/conftest.py, a Vocos; read, never changed): the
StableHLO and ONNX artifacts against the generator in process at two (B, T) (symbolic batch
and frames), the same for a HiFi-GAN generator (the run's config switched, random
parameters), the manifest, the synthesizer's export with --vocoder_workdir (both functions in
one directory, its "vocoder" filled, another front end refused in one line), and the
recognizer's flags refused in one line."""

from __future__ import annotations

import dataclasses
import json

import jax
import numpy as np
import pytest
from flax import nnx

from jaxspeech.common.errors import UserError
from jaxspeech.config import build
from jaxspeech.parallel import rules
from jaxspeech.serving import artifact_dir, staging
from jaxspeech.tts import artifact as tts_export
from jaxspeech.vocoder import artifact as vocoder_export
from jaxspeech.vocoder.hifigan import HiFiGANGenerator, vocode
from jaxspeech.vocoder.loading import FRONT_END_MATCH, generator_arguments, generator_graphdef
from tests.conftest import onnx_converter
from tests.e2e.cli import run_module

# Exported vs in process, waveform samples in [-1, 1]: the same float32 computation
# compiled for symbolic shapes (StableHLO: measured bit-equal on CPU) or by onnxruntime's
# kernels (ONNX: measured up to 6e-8) differs by rounding only; masks are equal exactly.
ATOL = {"stablehlo": 1e-5, "onnx": staging.ONNX_TOLERANCE}
SHAPES = [(2, 7, 0), (3, 23, 1)]  # (B, T, seed): two batch sizes and frame counts
HOP = 160


@pytest.fixture(scope="module")
def loaded(vocoder_tiny_run):
    """The tiny vocoder run on one device, as the export loads it, and its generator
    jitted in process (one compilation per shape for the module)."""
    run = vocoder_export.load_run(str(vocoder_tiny_run[0]))
    with rules.axis_rules(build.rules_from_config(run.config)):
        graphdef = generator_graphdef(run.config)
    fn = jax.jit(lambda gp, mel, mask: vocode(nnx.merge(graphdef, gp), mel, mask))
    return run, fn


def check_against_reference(got: list, loaded, feeds: dict, atol: float) -> float:
    """Exported (audio, sample_mask) vs the generator in process; returns the largest
    difference."""
    run, fn = loaded
    audio, sample_mask = (np.asarray(x) for x in got)
    mask = feeds["frame_mask"]
    want = np.asarray(fn(run.params["generator"], feeds["log_mel"], mask))
    assert audio.shape == want.shape == (mask.shape[0], mask.shape[1] * HOP)
    np.testing.assert_array_equal(sample_mask, np.repeat(mask, HOP, axis=1))
    np.testing.assert_allclose(audio, want, atol=atol, rtol=0)
    assert not audio[~sample_mask].any()  # zero past each row's frames
    return float(np.abs(audio - want).max())


@pytest.fixture(scope="module")
def stablehlo_artifact(vocoder_tiny_run, tmp_path_factory):
    """The default export, in process (the command line: test_onnx_matches_the_generator):
    (directory, manifest)."""
    out = tmp_path_factory.mktemp("vocoder-export") / "artifact"
    return out, vocoder_export.export_vocoder_run(str(vocoder_tiny_run[0]), str(out))


def test_manifest(stablehlo_artifact, loaded, vocoder_tiny_run):
    out, manifest = stablehlo_artifact
    run, _ = loaded
    assert manifest["run"]["step"] == run.step and manifest["format"] == "stablehlo"
    assert manifest["task"] == "vocoder" and manifest["format_version"] == 1
    assert manifest["files"] == ["vocoder.stablehlo", "manifest.json"]
    assert sorted(p.name for p in out.iterdir()) == sorted(manifest["files"])
    assert (manifest["audio"]["sample_rate"], manifest["hop_length"]) == (16000, HOP)
    assert manifest["n_mels"] == 80 and "raw, not normalized" in manifest["input"]["units"]
    assert set(FRONT_END_MATCH) < set(manifest["front_end"])
    assert manifest["front_end"]["log_floor"] == run.config.features.log_floor
    assert manifest["generator"]["kind"] == "vocos"
    assert manifest["generator"]["arguments"]["dim"] == 16  # configs/vocoder.py:tiny
    fn = manifest["functions"]["vocoder"]
    assert [i["name"] for i in fn["inputs"]] == ["log_mel", "frame_mask"]
    assert [i["shape"] for i in fn["inputs"]] == [["b", "t", "80"], ["b", "t"]]
    assert [i["dtype"] for i in fn["inputs"]] == ["float32", "bool"]
    assert [o["name"] for o in fn["outputs"]] == ["audio", "sample_mask"]
    assert fn["outputs"][0]["shape"] == fn["outputs"][1]["shape"] == ["b", "160*t"]
    meta = vocoder_tiny_run[0] / "checkpoints" / str(run.step) / "meta" / "metadata"
    if meta.exists():  # the fingerprint the checkpoint was saved with
        fingerprint = json.loads(meta.read_text())["params_fingerprint"]
        assert manifest["run"]["params_fingerprint"] == fingerprint


@pytest.mark.parametrize("b,t,seed", SHAPES)
def test_stablehlo_matches_the_generator(stablehlo_artifact, loaded, b, t, seed):
    out, _ = stablehlo_artifact
    exp = jax.export.deserialize((out / "vocoder.stablehlo").read_bytes())
    feeds = vocoder_export.check_inputs(80, b, t, seed)
    got = exp.call(*feeds.values())
    diff = check_against_reference(got, loaded, feeds, ATOL["stablehlo"])
    print(f"stablehlo (B, T) = ({b}, {t}): max |exported - in process| {diff:.3g}")


def test_onnx_matches_the_generator(vocoder_tiny_run, loaded, tmp_path):
    """The command line's ONNX export (the converter's environment) in onnxruntime."""
    python = onnx_converter()  # skipped without the converter, failed under make test
    run_dir, out = str(vocoder_tiny_run[0]), tmp_path / "onnx"
    args = ("--workdir", run_dir, "--output", str(out), "--format", "onnx")
    proc = run_module("jaxspeech.export", *args, "--onnx_python", python)
    printed = json.loads(proc.stdout.strip().splitlines()[-1])
    manifest = json.loads((out / artifact_dir.MANIFEST).read_text())
    assert printed["task"] == "vocoder" and printed["step"] == manifest["run"]["step"]
    assert sorted(manifest["files"]) == sorted(p.name for p in out.iterdir())
    assert manifest["files"] == ["vocoder.onnx", "manifest.json"]
    import onnxruntime as ort

    fn = manifest["functions"]["vocoder"]
    assert fn["max_abs_diff_vs_jax"] <= staging.ONNX_TOLERANCE and fn["dtype"] == "float32"
    session = ort.InferenceSession(str(out / fn["file"]), providers=["CPUExecutionProvider"])
    for b, t, seed in SHAPES:
        feeds = vocoder_export.check_inputs(80, b, t, seed)
        diff = check_against_reference(session.run(None, feeds), loaded, feeds, ATOL["onnx"])
        print(f"onnx (B, T) = ({b}, {t}): max |exported - in process| {diff:.3g}")


@pytest.fixture(scope="module")
def hifigan(loaded):
    """The tiny run with a tiny HiFi-GAN generator (config switched, random parameters)
    as `loaded`: (run, jitted generator)."""
    run = loaded[0]
    config = run.config.copy_and_resolve_references()
    config.vocoder.generator, config.vocoder.generator_channels = "hifigan", 16
    config.vocoder.resblocks = 1
    generator = HiFiGANGenerator(**generator_arguments(config), rngs=nnx.Rngs(0))
    params = nnx.to_pure_dict(nnx.state(generator, nnx.Param))
    run = dataclasses.replace(run, config=config, params={"generator": params})
    with rules.axis_rules(build.rules_from_config(config)):
        graphdef = generator_graphdef(config)
    return run, jax.jit(lambda gp, mel, mask: vocode(nnx.merge(graphdef, gp), mel, mask))


def test_hifigan_exports_too(hifigan, tmp_path):
    """StableHLO and ONNX (in process, `artifact.export_functions`) of a HiFi-GAN
    generator equal it; the staged description names its class."""
    run, _ = hifigan
    for fmt in ("stablehlo", "onnx"):
        python = onnx_converter() if fmt == "onnx" else None
        out = tmp_path / fmt
        out.mkdir()
        functions = vocoder_export.export_functions(run, fmt, str(out), python)
        feeds = vocoder_export.check_inputs(80, 2, 7)
        if fmt == "onnx":  # export_onnx compared it with JAX on these feeds already
            assert functions["vocoder"]["max_abs_diff_vs_jax"] <= ATOL["onnx"]
            continue
        exp = jax.export.deserialize((out / "vocoder.stablehlo").read_bytes())
        check_against_reference(exp.call(*feeds.values()), hifigan, feeds, ATOL["stablehlo"])


def test_with_a_synthesizer(tts_tiny_run, vocoder_tiny_run, loaded, tmp_path):
    """`--vocoder_workdir`: both functions in one directory, the acoustic manifest's
    "vocoder" filled; the acoustic model's log_mel and frame_mask feed the vocoder as
    they are."""
    out = tmp_path / "both"
    tts_dir, vocoder_dir = str(tts_tiny_run[0]), str(vocoder_tiny_run[0])
    manifest = tts_export.export_tts_run(tts_dir, str(out), vocoder_workdir=vocoder_dir)
    assert manifest["task"] == "tts" and list(manifest["functions"]) == ["acoustic", "vocoder"]
    assert manifest["files"] == ["acoustic.stablehlo", "vocoder.stablehlo", "manifest.json"]
    assert manifest == json.loads((out / artifact_dir.MANIFEST).read_text())
    section, run = manifest["vocoder"], loaded[0]
    assert section["function"] == "vocoder" and section["hop_length"] == HOP
    assert section["run"]["step"] == run.step and section["run"]["workdir"] == vocoder_dir
    assert section["front_end"]["num_mel_bins"] == manifest["n_mels"] == 80
    assert manifest["griffin_lim"]["n_iter"] == 64  # still described beside it
    # `python -m jaxspeech.synthesize --artifact` vocodes with the exported generator as
    # the vocoder run does in process (`vocoder.inference.NeuralVocoder`).
    from jaxspeech.tts import synthesis
    from jaxspeech.vocoder.inference import NeuralVocoder

    synth = synthesis.from_artifact(str(out))
    assert synth.vocoder_name == "vocos"  # the manifest's kind (configs/vocoder.py:tiny)
    sentence = [synthesis.Sentence(1, "_ a m _", "_ a m _", ["_", "a", "m", "_"])]
    mels = synthesis.spoken_mels(synth, sentence, 0, 1.0)
    (audio,) = synthesis.vocoded(synth, mels, "auto")
    (want,) = NeuralVocoder(run, synth.max_frames)(mels)
    assert len(audio) == len(mels[0]) * HOP and np.isfinite(audio).all()
    np.testing.assert_allclose(audio, want, atol=1e-4)


def test_bad_command_lines(tts_tiny_run, vocoder_tiny_run, tmp_path):
    run_dir = str(vocoder_tiny_run[0])
    args = ("--workdir", run_dir, "--output", str(tmp_path / "x"), "--int8", "--max_frames=9")
    proc = run_module("jaxspeech.export", *args, check=False)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"error: bad command line: --int8, --max_frames: not for a vocoder's export; "
        f"{run_dir} is a vocoder's run (config.task=vocoder)"
    ]
    assert not (tmp_path / "x").exists()
    # A vocoder trained on other features (only its config is read: refused first).
    other = tmp_path / "other-vocoder"
    other.mkdir()
    config = json.loads((vocoder_tiny_run[0] / "config.json").read_text())
    config["features"]["fmax"] = 7600.0
    (other / "config.json").write_text(json.dumps(config))
    with pytest.raises(UserError) as e:
        tts_export.export_tts_run(
            str(tts_tiny_run[0]), str(tmp_path / "y"), vocoder_workdir=str(other)
        )
    assert "\n" not in str(e.value) and "fmax 7600.0 vs 8000.0" in str(e.value)
    assert not (tmp_path / "y").exists()
    with pytest.raises(UserError, match="unknown export format 'both'"):
        vocoder_export.export_vocoder_run(run_dir, str(tmp_path / "z"), fmt="both")
