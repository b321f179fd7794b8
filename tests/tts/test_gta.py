"""Ground-truth-aligned frames (jaxspeech/tts/gta.py, jaxspeech/data/frame_store.py,
jaxspeech/vocoder/gta.py, the vocoder's loader and device batch): the tiny synthesizer's
teacher-forced log-mel of the tiny corpus's train split written by `jaxspeech.synthesize
--gta_split` (in process), one store entry per utterance with the recording's frame count;
the loader's windows start on a frame and carry exactly the store's frames of that window
(found by locating the window in the recording); the device batch uses them on those rows
only; a tiny vocoder run trains on them; every mistake is one line.

The session's tiny runs and corpus (tests/tts/conftest.py) are read, never changed."""

from __future__ import annotations

import json
import os
import pickle

import jax.numpy as jnp
import numpy as np
import pytest

from configs import tts, vocoder
from jaxspeech.audio import features
from jaxspeech.common.errors import UserError
from jaxspeech.config import build
from jaxspeech.data import frame_store, records
from jaxspeech.data.reader import audio_float32, read_split_records
from jaxspeech.evaluation import splits as eval_splits
from jaxspeech.tts import gta as tts_gta
from jaxspeech.vocoder import batch as vocoder_batch
from jaxspeech.vocoder import gta as vocoder_gta
from jaxspeech.vocoder.objective import device_batch
from tests.e2e.cli import run_module, session_overrides
from tests.tts.test_synthesize import run_main

HOP, SEGMENT = 160, 1600  # configs/vocoder.py:tiny's segment


def test_the_command_writes_every_train_utterance(tts_tiny_run, tts_corpus, tmp_path, capsys):
    path = tmp_path / "gta.npz"
    args = [f"--workdir={tts_tiny_run[0]}", "--gta_split=train", f"--output={path}"]
    code, out, err = run_main([*args, f"--data={tts_corpus}"], capsys)
    assert code == 0, err
    manifest = json.loads(out.strip().splitlines()[-1])
    recs = read_split_records(str(tts_corpus), "train")
    assert manifest["utterances"] == len(recs) == 24 and manifest["skipped"] == []
    assert "wrote the ground-truth-aligned log-mel of 24 utterances of train" in err
    store = frame_store.FrameStore(str(path))
    assert store.manifest["split_records"] == 24 and sorted(store.ids()) == sorted(
        r["id"] for r in recs
    )
    cfg = features.LogMelConfig()
    shifts = (-2, 0, 2)
    errors = {k: [] for k in shifts}
    for rec in recs:
        frames = store.get(rec["id"])
        audio = audio_float32(rec)
        # One frame per hop of the recording (the synthesizer's targets' frames), raw
        # log-mel, aligned with the recording's own: nearer to it, frame by frame, than
        # to the recording moved by two frames either way.
        assert frames.shape == (1 + len(audio) // HOP, cfg.num_mel_bins), rec["id"]
        own = np.asarray(features.log_mel(jnp.asarray(audio[None]), cfg)[0, : len(frames)])
        for k in shifts:
            a, b = (frames[k:], own[: len(own) - k]) if k >= 0 else (frames[:k], own[-k:])
            errors[k].append(np.mean(np.abs(a - b)))
    mean = {k: float(np.mean(v)) for k, v in errors.items()}
    assert mean[0] < min(mean[-2], mean[2]), mean
    # A store pickles as its path (loader workers open their own).
    again = pickle.loads(pickle.dumps(store))
    assert np.array_equal(again.get(recs[0]["id"]), store.get(recs[0]["id"]))
    # What the vocoder checks before it trains: the split's records and the front end.
    config = vocoder.get_config("tiny")
    config.vocoder.gta_mels = str(path)
    opened = vocoder_gta.open_gta_mels(config, build.feature_config(config))
    assert "24 of 24 utterances" in vocoder_gta.coverage(opened, 24)
    with pytest.raises(UserError, match="made from 24 records"):
        vocoder_gta.coverage(opened, 25)


def test_loader_windows_carry_their_frames(tts_corpus, tmp_path):
    """Frames made from the recordings' own log-mel (so a window's frames can be checked
    against the window itself): each row's window starts on a frame k and its gta_mel is
    frames k .. k + T - 1 of the utterance; rows of utterances the store lacks have none."""
    recs = read_split_records(str(tts_corpus), "train")
    cfg = features.LogMelConfig()
    mels = {}
    for rec in recs[1:]:  # the first one is missing from the store
        audio = audio_float32(rec)
        mels[rec["id"]] = np.asarray(features.log_mel(jnp.asarray(audio[None]), cfg)[0])
    path = str(tmp_path / "own.npz")
    frame_store.write_frame_store(path, mels.items(), {"kind": frame_store.GTA_LOG_MEL})
    store = frame_store.FrameStore(path)
    pipe = vocoder_batch.make_vocoder_pipeline(
        data_dir=str(tts_corpus),
        split="train",
        spec=None,
        segment_samples=SEGMENT,
        batch_size=24,
        seed=3,
        train=True,
        with_ids=True,
        gta=store,
    )
    batch = next(iter(pipe.dataset()))
    by_id = {r["id"]: audio_float32(r) for r in recs}
    t = 1 + SEGMENT // HOP
    assert batch["gta_mel"].shape == (24, t, cfg.num_mel_bins)
    for row, utt in enumerate(batch["id"]):
        audio, window = by_id[utt], batch["audio"][row, : batch["audio_len"][row]]
        if utt not in mels:
            assert batch["gta"][row] == 0 and not batch["gta_mel"][row].any()
            continue
        starts = [
            s
            for s in range(len(audio) - len(window) + 1)
            if np.array_equal(audio[s : s + len(window)], window)
        ]
        # (The tones repeat: the window may occur at several places; one is its own.)
        assert batch["gta"][row] == 1 and starts, utt
        frames = [mels[utt][s // HOP : s // HOP + t] for s in starts if s % HOP == 0]
        gta = batch["gta_mel"][row]
        assert any(np.array_equal(gta[: len(f)], f.astype(np.float16)) for f in frames), utt


def test_the_device_batch_takes_the_frames_of_rows_that_have_them():
    rng = np.random.default_rng(0)
    audio = rng.normal(0, 0.1, (2, SEGMENT)).astype(np.float32)
    t = 1 + SEGMENT // HOP
    given = rng.normal(-5, 1, (2, t, 80)).astype(np.float32)
    batch = {
        "audio": audio,
        "audio_len": np.array([SEGMENT, SEGMENT], np.int32),
        "gta_mel": given,
        "gta": np.array([1.0, 0.0], np.float32),
    }
    cfg = features.LogMelConfig()
    vb = device_batch(batch, cfg)
    own = np.asarray(features.log_mel(jnp.asarray(audio), cfg)[:, :t])
    np.testing.assert_array_equal(np.asarray(vb["mel"][0]), given[0])
    np.testing.assert_allclose(np.asarray(vb["mel"][1]), own[1], atol=1e-5)


def test_a_vocoder_trains_on_them(tts_tiny_run, tts_corpus, tmp_path, capsys):
    path = tmp_path / "gta.npz"
    args = [f"--workdir={tts_tiny_run[0]}", "--gta_split=train", f"--output={path}"]
    code, _, err = run_main([*args, f"--data={tts_corpus}", "--gta_max_utterances=12"], capsys)
    assert code == 0, err
    out = run_module(
        "jaxspeech.train",
        "--config",
        "configs/vocoder.py:tiny",
        "--workdir",
        str(tmp_path / "run"),
        f"--config.data.dir={tts_corpus}",
        f"--config.vocoder.gta_mels={path}",
        "--config.train.num_steps=4",
        "--config.train.eval_at_end=False",
        "--config.monitor.samples_every=0",
        *session_overrides(),
    ).stdout
    assert "vocoder input: 12 of 24 utterances as " in out
    rows = [json.loads(line) for line in open(tmp_path / "run" / "metrics.jsonl")]
    assert all(np.isfinite(r["train/loss_mel"]) for r in rows if "train/loss_mel" in r)
    assert os.path.isdir(tmp_path / "run" / "checkpoints" / "4")


def test_mistakes_are_one_line(tts_tiny_run, tts_corpus, tmp_path, capsys):
    base = [f"--workdir={tts_tiny_run[0]}", f"--data={tts_corpus}"]
    for extra, says in [
        (["--gta_split=train", f"--output={tmp_path}/x.npz", "--text=a"], "drop --text"),
        (["--gta_split=train"], "needs --workdir TTS_RUN and --output"),
        (["--gta_split=train", f"--output={tmp_path}/x.wav"], "one .npz file"),
        (["--gta_split=nosuch", f"--output={tmp_path}/x.npz"], "nosuch"),
    ]:
        code, _, err = run_main([*base, *extra], capsys)
        assert code == 2 and says in err and len(err.strip().splitlines()) == 1, err
    assert not os.listdir(tmp_path)  # nothing written, no temporary left behind
    config = vocoder.get_config("tiny")
    cfg = build.feature_config(config)
    config.vocoder.gta_mels = str(tmp_path / "none.npz")
    with pytest.raises(UserError, match="no such file; write it with"):
        vocoder_gta.open_gta_mels(config, cfg)
    other = str(tmp_path / "other.npz")
    manifest = {"kind": frame_store.GTA_LOG_MEL, "split": "dev"}
    frame_store.write_frame_store(other, [], manifest)
    config.vocoder.gta_mels = other
    with pytest.raises(UserError, match="frames of split 'dev'"):
        vocoder_gta.open_gta_mels(config, cfg)
    frame_store.write_frame_store(other, [], manifest | {"split": "train", "features": {}})
    with pytest.raises(UserError, match="another front end"):
        vocoder_gta.open_gta_mels(config, cfg)
    with pytest.raises(ValueError, match="repeated"):
        frame_store.write_frame_store(other, [("a", np.zeros((1, 2)))] * 2, {})
    assert sorted(os.listdir(tmp_path)) == ["other.npz"]  # the failed write left no temporary
    assert records.read_split_index(str(tts_corpus), "train").num_records == 24


def test_the_subset_is_spread_and_each_record_planned_once(tts_corpus):
    """`--gta_max_utterances N`: N records spread evenly over the split, each planned once,
    in the shortest bucket that holds it (checked against the buckets one by one)."""
    assert list(tts_gta.spread(10, 4)) == [0, 2, 5, 7]
    assert list(tts_gta.spread(3, 5)) == [0, 1, 2]
    index = records.read_split_index(str(tts_corpus), "train")
    spec = eval_splits.eval_bucket_spec(tts.get_config("tiny"), index.durations, 1)
    positions = tts_gta.spread(index.num_records, 13)
    planned = list(tts_gta.planned_batches(index, spec, positions))
    seen = np.concatenate([p.indices[p.indices >= 0] for p in planned])
    assert sorted(seen) == sorted(positions)
    for p in planned:
        assert len(p.indices) == spec.batch_sizes[p.bucket]
        for i in p.indices[p.indices >= 0]:
            samples = round(index.durations[i] * index.sample_rate)
            fits = [b for b in range(len(spec.boundaries)) if samples <= spec.num_samples(b)]
            assert p.bucket == fits[0], (i, samples)
