"""Tests for the espeak-ng demo corpus: wrapper, sentence generator and the CLI end to end."""

import hashlib
import json
import os
import re

import numpy as np
import pytest
import soundfile as sf

from data_prep.demo import corpus_dir, make_texts, sentences, synth
from jaxspeech.tts.text.espeak import Espeak, EspeakError

TINY_HOURS = "0.02"  # ~30 utterances: every speaker once, a few seconds of synthesis
TINY_TTS = 10  # tts_heldout utterances: two render chunks of the fixture's CHUNK_SIZE 8
ALL_SPLITS = (*synth.SPLITS, synth.TTS_SPLIT)
TINY, OURS = float(TINY_HOURS), set(ALL_SPLITS)  # prepare_output's hours and names


def _run(out, seed=0, workers=1, natural_share=0.5, tts_heldout=TINY_TTS, *extra):
    """The tiny corpus; half of its training sentences natural, as the demo's."""
    return synth.main(
        [
            *extra,
            "--output",
            str(out),
            "--hours",
            TINY_HOURS,
            "--seed",
            str(seed),
            "--workers",
            str(workers),
            "--natural_share",
            str(natural_share),
            "--tts_heldout",
            str(tts_heldout),
        ]
    )


def _manifest(root, split):
    with open(os.path.join(root, split, "manifest.jsonl")) as f:
        return [json.loads(line) for line in f]


def _digest(root) -> dict[str, str]:
    """sha256 of every file under root, by relative path."""
    out = {}
    for dirpath, _, files in os.walk(root):
        for name in files:
            path = os.path.join(dirpath, name)
            with open(path, "rb") as f:
                out[os.path.relpath(path, root)] = hashlib.sha256(f.read()).hexdigest()
    return out


@pytest.fixture(scope="module")
def corpora(tmp_path_factory):
    """The tiny corpus built four ways: seed 0 with 1 and 2 workers, seed 1, and seed 0
    without the tts_heldout split."""
    # Small render chunks so the train split spans several worker processes, exercising
    # the fresh-process-per-chunk rule that makes output independent of --workers.
    mp = pytest.MonkeyPatch()
    mp.setattr(synth, "CHUNK_SIZE", 8)
    base = tmp_path_factory.mktemp("synth")
    try:
        dirs = {name: base / name for name in ("w1", "w2", "seed1", "no_tts")}
        infos = {
            "w1": _run(dirs["w1"], seed=0, workers=1),
            "w2": _run(dirs["w2"], seed=0, workers=2),
            "seed1": _run(dirs["seed1"], seed=1, workers=2),
            "no_tts": _run(dirs["no_tts"], seed=0, workers=2, tts_heldout=0),
        }
    finally:
        mp.undo()
    return dirs, infos


def test_manifests_and_audio(corpora):
    dirs, infos = corpora
    root = dirs["w1"]
    ids = set()
    for split in ALL_SPLITS:
        rows = _manifest(root, split)
        assert rows and infos["w1"]["splits"][split]["utterances"] == len(rows)
        for row in rows:
            assert list(row) == [
                "audio_filepath",
                "text",
                "duration",
                "speaker",
                "phonemes",
                "phoneme_ends",
            ]
            assert re.fullmatch(r"audio/[a-z_]+-[a-z0-9_]+-\d{5}\.wav", row["audio_filepath"])
            utt_id = row["audio_filepath"][len("audio/") : -len(".wav")]
            assert utt_id.startswith(f"{split}-{row['speaker']}-") and utt_id not in ids
            ids.add(utt_id)
            assert re.fullmatch(r"[a-z']+( [a-z']+)*", row["text"])
            assert 4 <= len(row["text"].split()) <= 16
            path = os.path.join(root, split, row["audio_filepath"])
            info = sf.info(path)
            assert (info.samplerate, info.channels, info.subtype) == (16000, 1, "PCM_16")
            samples, _ = sf.read(path, dtype="int16")
            assert samples.ndim == 1
            assert row["duration"] == pytest.approx(len(samples) / 16000, abs=1e-9)
            # Phonemes with their ends: edge silences, non-decreasing, ending with the WAV.
            tokens, ends = row["phonemes"].split(" "), row["phoneme_ends"]
            assert len(tokens) == len(ends) >= 5 and tokens[0] == tokens[-1] == "_"
            assert all(t for t in tokens) and ends == sorted(ends) and ends[0] > 0
            assert ends[-1] == row["duration"] and ends[-2] < ends[-1]
            # Edge silences are at most ~0.2 s: speech starts and ends near the edges.
            loud = np.flatnonzero(np.abs(samples.astype(np.int32)) > 0.01 * 32768)
            assert loud[0] / 16000 < 0.25 and (len(samples) - loud[-1]) / 16000 < 0.25
    info = json.loads((root / "corpus_info.json").read_text())
    assert info["seed"] == 0 and info["generator_version"] == synth.GENERATOR_VERSION
    assert info["distinct_words"] > 0 and set(info["splits"]) == set(ALL_SPLITS)
    assert not (root / synth.PARTIAL_FILE).exists()
    # Natural sentences were rendered into train only, and counted.
    sotu = {t for t, _ in make_texts.read_sentences(make_texts.SOTU)}
    train = [r["text"] for r in _manifest(root, "train")]
    natural = info["natural_sentences"]
    assert info["natural_share"] == 0.5 and 0 < natural["used"] < len(train)
    assert natural["used"] == sum(t in sotu for t in train)
    assert not any(r["text"] in sotu for s in ("dev", "test") for r in _manifest(root, s))


def test_tts_heldout_split(corpora):
    """Unseen sentences by training speakers, taking turns, with their own prosody."""
    dirs, infos = corpora
    rows = _manifest(dirs["w1"], synth.TTS_SPLIT)
    train_speakers = [s.name for s in synth.SPEAKERS if s.split == "train"]
    assert [r["speaker"] for r in rows] == train_speakers[:TINY_TTS]
    assert rows[0]["audio_filepath"] == f"audio/tts_heldout-{train_speakers[0]}-00001.wav"
    texts = [r["text"] for r in rows]
    others = {r["text"] for s in synth.SPLITS for r in _manifest(dirs["w1"], s)}
    others |= {t for t, _ in make_texts.read_sentences(make_texts.MOBY_DICK)}
    assert len(set(texts)) == TINY_TTS and not set(texts) & others
    info = infos["w1"]
    assert info["tts_heldout"] == TINY_TTS
    assert info["splits"][synth.TTS_SPLIT]["utterances"] == TINY_TTS
    assert info["splits"][synth.TTS_SPLIT]["speakers"] == sorted(train_speakers[:TINY_TTS])
    # The demo's size and default: two utterances per training speaker, 96 distinct
    # sentences in no other split, and every utterance before them as planned without.
    plan = synth.plan_corpus(3.0, 0, 0.25, tts_heldout=synth.DEFAULT_TTS_HELDOUT)
    held = [u for u in plan if u.split == synth.TTS_SPLIT]
    assert plan[: -len(held)] == synth.plan_corpus(3.0, 0, 0.25)
    assert len(held) == 96 and {u.speaker for u in held} == set(train_speakers)
    assert len({u.text for u in held}) == 96
    base = {s.name: s for s in synth.SPEAKERS}
    assert all(abs(u.rate / base[u.speaker].rate - 1) <= 0.11 for u in held)
    assert not {u.text for u in held} & {u.text for u in plan[: -len(held)]}


def test_tts_heldout_leaves_the_other_splits_byte_identical(corpora):
    dirs, infos = corpora
    with_tts, without = _digest(dirs["w1"]), _digest(dirs["no_tts"])
    assert set(without) == {p for p in with_tts if not p.startswith(synth.TTS_SPLIT + os.sep)}
    assert all(with_tts[p] == h for p, h in without.items() if p != synth.INFO_FILE)
    assert not (dirs["no_tts"] / synth.TTS_SPLIT).exists()
    assert set(infos["no_tts"]["splits"]) == set(synth.SPLITS)
    assert infos["no_tts"]["splits"] == {s: infos["w1"]["splits"][s] for s in synth.SPLITS}


def test_splits_disjoint_and_held_out_speakers(corpora):
    dirs, _ = corpora
    texts, speakers = {}, {}
    for split in synth.SPLITS:
        rows = _manifest(dirs["w1"], split)
        texts[split] = {r["text"] for r in rows}
        speakers[split] = {r["speaker"] for r in rows}
    assert not texts["train"] & texts["dev"]
    assert not texts["train"] & texts["test"]
    assert not texts["dev"] & texts["test"]
    assert len(speakers["test"]) >= 2 and not speakers["test"] & (
        speakers["train"] | speakers["dev"]
    )
    assert len(speakers["dev"]) == 2 and not speakers["dev"] & speakers["train"]
    assert len(speakers["train"]) >= 20
    # Held-out speakers are new timbres (variants), in accents that train covers.
    train_spk = [s for s in synth.SPEAKERS if s.split == "train"]
    for s in synth.SPEAKERS:
        if s.split != "train":
            assert s.variant not in {t.variant for t in train_spk}
            assert s.accent in {t.accent for t in train_spk}


def test_deterministic_across_workers_and_seeds(corpora):
    dirs, infos = corpora
    assert _digest(dirs["w1"]) == _digest(dirs["w2"])
    assert _digest(dirs["seed1"]) != _digest(dirs["w1"])
    assert _manifest(dirs["w1"], "train") != _manifest(dirs["seed1"], "train")


def test_output_dir_rules(corpora, tmp_path, monkeypatch, capsys):
    dirs, _ = corpora
    monkeypatch.setattr(synth, "CHUNK_SIZE", 8)  # as the fixture built it
    # Another seed into an existing corpus: refused, nothing touched.
    before = _digest(dirs["w2"])
    with pytest.raises(SystemExit):
        _run(dirs["w2"], seed=5)
    assert "built with" in capsys.readouterr().err
    assert _digest(dirs["w2"]) == before
    # The same arguments again: rebuilt in place, identical.
    _run(dirs["w2"], seed=0, workers=2)
    assert _digest(dirs["w2"]) == before
    # A directory holding something else: refused.
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    with pytest.raises(SystemExit):
        _run(other)
    assert "does not hold a synth_demo corpus" in capsys.readouterr().err
    assert os.listdir(other) == ["notes.txt"]
    # Another natural share into an existing corpus: refused; a share outside [0, 1]: one line.
    with pytest.raises(SystemExit):
        _run(dirs["w2"], seed=0, natural_share=0.25)
    assert "built with" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        _run(tmp_path / "new", natural_share=1.5)
    assert "--natural_share must be in [0, 1], got 1.5" in capsys.readouterr().err
    # Another --tts_heldout: refused; a negative one: one line.
    with pytest.raises(SystemExit):
        _run(dirs["w2"], seed=0, workers=2, tts_heldout=0)
    assert "built with" in capsys.readouterr().err
    assert _digest(dirs["w2"]) == before
    with pytest.raises(SystemExit):
        _run(tmp_path / "new", tts_heldout=-1)
    assert "--tts_heldout must be >= 0, got -1" in capsys.readouterr().err
    # --check (make demo's, before training): the finished corpus of the same arguments
    # passes untouched; another share, or no finished corpus, is one line and exit 2.
    assert _run(dirs["w2"], 0, 1, 0.5, TINY_TTS, "--check")["natural_share"] == 0.5
    assert _digest(dirs["w2"]) == before
    with pytest.raises(SystemExit):
        _run(dirs["w2"], 0, 1, 0.25, TINY_TTS, "--check")
    assert "built with" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        _run(tmp_path / "none", 0, 1, 0.5, TINY_TTS, "--check")
    assert "holds no finished synth_demo corpus" in capsys.readouterr().err
    assert not (tmp_path / "none").exists()
    # A corpus from before the split (no "tts_heldout" in its info) counts as built with 0:
    # rebuilt by --tts_heldout 0, refused otherwise.
    old = tmp_path / "old"
    (old / "train").mkdir(parents=True)
    info = json.loads((dirs["no_tts"] / synth.INFO_FILE).read_text())
    del info["tts_heldout"]
    (old / synth.INFO_FILE).write_text(json.dumps(info))
    with pytest.raises(FileExistsError, match="'tts_heldout': 0"):
        corpus_dir.prepare_output(str(old), synth._identity(TINY, 0, 0.5, TINY_TTS), OURS)
    corpus_dir.prepare_output(str(old), synth._identity(TINY, 0, 0.5, 0), OURS)
    assert os.listdir(old) == []


def test_sentence_generator_vocabulary():
    # As many sentences as the default corpus (3 h, seed 0) has utterances.
    n = len(synth.plan_corpus(3.0, 0))
    gen = sentences.SentenceGenerator(0)
    batch = gen.take(n)
    assert len({s.text for s in batch}) == n
    words = {w for s in batch for w in s.text.split()}
    assert len(words) >= 2000, len(words)
    for s in batch[:500]:
        assert re.fullmatch(r"[a-z']+( [a-z']+)*", s.text)
        assert sentences.MIN_WORDS <= s.num_words <= sentences.MAX_WORDS
        # The spoken text is the transcript plus capitals and punctuation, nothing else.
        assert re.sub(r"[,.?!]", "", s.spoken).lower() == s.text
    assert [s.text for s in sentences.SentenceGenerator(0).take(50)] == [s.text for s in batch[:50]]
    assert sentences.SentenceGenerator(1).take(50) != batch[:50]


def test_morphology():
    assert [sentences.pluralize(w) for w in ("box", "city", "key", "bus", "piano")] == [
        "boxes",
        "cities",
        "keys",
        "buses",
        "pianos",
    ]
    verbs = sentences._VERBS
    assert (verbs["drop"].past, verbs["drop"].ing) == ("dropped", "dropping")
    assert (verbs["carry"].s, verbs["carry"].past) == ("carries", "carried")
    assert (verbs["go"].s, verbs["go"].past, verbs["go"].pp) == ("goes", "went", "gone")
    assert (verbs["swim"].past, verbs["swim"].ing) == ("swam", "swimming")
    assert (verbs["tie"].ing, verbs["smile"].ing) == ("tying", "smiling")
    assert " ".join(sentences.number_words(342)) == "three hundred and forty two"
    assert " ".join(sentences.year_words(1905)) == "nineteen oh five"
    assert sentences.indefinite_article("hour") == "an"
    assert sentences.indefinite_article("uniform") == "a"


def test_espeak_wrapper():
    tts = Espeak.get()
    assert tts.sample_rate == 22050
    tts.set_voice("en-us", "m3")
    tts.set_prosody(rate=175, pitch=50, pitch_range=50)
    wav = tts.synthesize("Hello there.")
    assert wav.dtype == np.int16 and wav.ndim == 1 and len(wav) > 0.3 * tts.sample_rate
    with pytest.raises(EspeakError, match="cannot load voice"):
        tts.set_voice("xx-nonexistent")
    with pytest.raises(EspeakError, match="unknown espeak-ng voice variant"):
        tts.set_voice("en-us", "nosuchvariant")
    with pytest.raises(EspeakError):
        tts.set_prosody(rate=10)
