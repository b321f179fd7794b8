"""Writes the Lhotse manifests of tests/data_prep/test_lhotse.py with Lhotse itself.

The manifests are stored next to this script; the audio they point at is not (the test
writes it with `write_audio`, the same samples every time). Lhotse imports PyTorch, which
jaxspeech does not install, so the manifests were made once in a separate environment:

    python -m venv /tmp/lh && /tmp/lh/bin/pip install torch lhotse urllib3 soundfile
    cd tests/data_prep/lhotse_inputs && /tmp/lh/bin/python make.py

(made with lhotse 1.33.0). Relative audio paths in the manifests are relative to this
directory, as Lhotse's are to the directory it ran in.
"""

from __future__ import annotations

import os

import numpy as np
import soundfile as sf

RATE = 8000


def audio_samples() -> dict[str, np.ndarray]:
    """name -> (N, C) int16 samples: rec1 2 s mono, rec2 1 s stereo (distinct channels)."""
    rng = np.random.default_rng(7)
    return {
        "rec1": rng.integers(-9000, 9000, (2 * RATE, 1)).astype(np.int16),
        "rec2": rng.integers(-9000, 9000, (RATE, 2)).astype(np.int16),
    }


def write_audio(directory: str) -> dict[str, np.ndarray]:
    """DIR/audio/rec1.wav and DIR/audio/rec2.flac; returns their samples."""
    os.makedirs(os.path.join(directory, "audio"), exist_ok=True)
    samples = audio_samples()
    sf.write(os.path.join(directory, "audio", "rec1.wav"), samples["rec1"], RATE, "PCM_16")
    sf.write(os.path.join(directory, "audio", "rec2.flac"), samples["rec2"], RATE, "PCM_16")
    return samples


def main() -> None:
    from lhotse import CutSet, Recording, RecordingSet, SupervisionSegment, SupervisionSet
    from lhotse.audio import AudioSource

    here = os.path.dirname(os.path.abspath(__file__))
    os.chdir(here)
    write_audio(here)
    rec1 = Recording.from_file("audio/rec1.wav", recording_id="rec1")
    rec2 = Recording.from_file("audio/rec2.flac", recording_id="rec2")

    def listed(rid: str, kind: str, source: str) -> Recording:
        src = AudioSource(type=kind, channels=[0], source=source)
        return Recording(rid, [src], sampling_rate=RATE, num_samples=RATE, duration=1.0)

    recordings = RecordingSet.from_recordings(
        [
            rec1,
            rec2,
            listed("rec3", "file", "audio/missing.wav"),
            listed("rec4", "url", "https://example.com/rec4.wav"),
            listed("rec5", "command", "cat audio/rec1.wav"),
        ]
    )

    def sup(sid, rid, start, duration, text, channel=0, speaker="spk1"):
        return SupervisionSegment(
            id=sid,
            recording_id=rid,
            start=start,
            duration=duration,
            channel=channel,
            text=text,
            speaker=speaker,
        )

    good = [
        sup("s1a", "rec1", 0.0, 1.0, "the first half"),
        sup("s1b", "rec1", 1.0, 1.0, "the second half", speaker="spk2"),
        sup("s2l", "rec2", 0.0, 1.0, "the left channel", channel=0),
        sup("s2r", "rec2", 0.25, 0.5, "the right channel", channel=1),
        sup("s2m", "rec2", 0.0, 1.0, "both channels", channel=[0, 1]),
    ]
    bad = [
        sup("s1past", "rec1", 1.5, 1.0, "past the end"),
        sup("s1neg", "rec1", -0.5, 1.0, "a negative start"),
        sup("s1zero", "rec1", 0.5, 0.0, "no duration"),
        sup("s1empty", "rec1", 0.0, 1.0, ""),
        sup("s1a", "rec1", 0.0, 2.0, "a duplicate id"),
        sup("s9", "rec9", 0.0, 1.0, "no such recording"),
        sup("s1ch3", "rec1", 0.0, 1.0, "no such channel", channel=3),
        sup("s3", "rec3", 0.0, 1.0, "a missing file"),
        sup("s4", "rec4", 0.0, 1.0, "a remote url"),
        sup("s5", "rec5", 0.0, 1.0, "a shell command"),
    ]
    supervisions = SupervisionSet.from_segments(good + bad)
    recordings.to_file("recordings.jsonl.gz")
    supervisions.to_file("supervisions.jsonl.gz")

    # Cuts as icefall's recipes store them: one per supervision of the good recordings,
    # plus a cut without supervisions, a mixed cut and a speed-perturbed one.
    cuts = CutSet.from_manifests(
        recordings=RecordingSet.from_recordings([rec1, rec2]),
        supervisions=SupervisionSet.from_segments(good),
    ).trim_to_supervisions(keep_overlapping=False)
    cuts = cuts.modify_ids(lambda cid: f"cut-{cid}")
    whole = CutSet.from_manifests(recordings=RecordingSet.from_recordings([rec1]))
    empty = whole[0].with_id("cut-silent")
    mixed = cuts[0].append(cuts[1]).with_id("cut-mixed")
    fast = cuts[0].perturb_speed(1.1).with_id("cut-fast")
    CutSet.from_cuts(list(cuts) + [empty, mixed, fast]).to_file("cuts.jsonl.gz")


if __name__ == "__main__":
    main()
