"""Tiny end-to-end run through the CLIs: synthesize, prepare, train, resume, evaluate."""

import json
import os

import jax
import numpy as np
import pytest
import soundfile as sf

from data_prep import lm as lm_build
from jaxspeech.data import reader
from jaxspeech.evaluation import run as eval_run
from jaxspeech.parallel import mesh as mesh_lib
from jaxspeech.runs import events as run_events
from jaxspeech.runs import loading
from jaxspeech.serving import recognizer as transcribe_lib
from tests.e2e.cli import run_module, train_args
from tests.e2e.test_faults import ONE_SHAPE

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
pytestmark = pytest.mark.slow


def run(*args, check=True):
    return run_module(*args, check=check)


def train(workdir, shards, *extra):
    return run("jaxspeech.train", *train_args(workdir, shards, *extra))


def final_params(workdir):
    """(latest step, host copies of its {"params", "model_vars"}) of a run."""
    mesh = mesh_lib.make_mesh({"data": 1}, devices=jax.devices()[:1])
    run = loading.load_run(str(workdir), mesh=mesh)
    model = {"params": run.params, "model_vars": run.model_vars}
    return run.step, jax.tree.map(np.asarray, model)


def _events(workdir) -> list[tuple]:
    """(event, step) of RUN/events.jsonl in order, with each `checkpoint_committed` checked
    to follow its `checkpoint_saved` and then left out: a commit is noticed when the
    background write is found finished, at no fixed place in the sequence."""
    events = [(e["event"], e.get("step")) for e in run_events.read_events(str(workdir))]
    saved = [i for i, (name, _) in enumerate(events) if name == "checkpoint_saved"]
    for i in saved:
        step = events[i][1]
        assert ("checkpoint_committed", step) in events[i + 1 :], (step, events)
    return [e for e in events if e[0] != "checkpoint_committed"]


def test_train_resume_matches_uninterrupted_and_evaluates(corpus, tiny_run):
    root, shards = corpus
    straight, out = tiny_run
    assert "100% 8/8" in out and "eval step 8: dev" in out
    assert _events(straight) == [
        ("started", 0),
        ("checkpoint_saved", 4),
        # The final checkpoint is committed before the final evaluation (a Ctrl-C there
        # loses no step).
        ("checkpoint_saved", 8),
        ("evaluated", 8),  # dev
        ("evaluated", 8),  # test
        ("finished", 8),
    ]

    resumed = root / "resumed"
    first = train(resumed, shards, "--config.train.run_steps=4").stdout
    assert "stopping at step 4 of 8" in first
    second = train(resumed, shards).stdout
    assert "100% 8/8" in second
    step_a, a = final_params(straight)
    step_b, b = final_params(resumed)
    assert step_a == step_b == 8
    # Same topology, same data order, same per-step randomness: identical to the bit.
    jax.tree.map(np.testing.assert_array_equal, a, b)
    # The feature statistics of the corpus travel inside the checkpoint.
    stats = json.load(open(shards / "train" / "stats.json"))
    np.testing.assert_allclose(
        a["model_vars"]["frontend"]["mean"], np.array(stats["sum"]) / stats["count"], rtol=1e-5
    )

    # Rerunning a finished run trains nothing more and evaluates again (idempotent `make demo`).
    third = train(resumed, shards).stdout
    assert "training steps 8 -> 8" in third and "eval step 8" in third
    events = _events(resumed)
    assert events[: events.index(("stopped", 4)) + 1] == [
        ("started", 0),
        ("checkpoint_saved", 4),
        ("stopped", 4),
    ]
    assert [e for e in events if e[0] in ("started", "resumed", "finished")] == [
        ("started", 0),
        ("resumed", 4),
        ("started", 4),
        ("finished", 8),
        ("resumed", 8),
        ("started", 8),
        ("finished", 8),
    ]

    ev = run(
        "jaxspeech.evaluate", "--workdir", str(resumed), "--data", str(shards), "--split", "test"
    )
    result = json.loads(ev.stdout.strip().splitlines()[-1])
    saved = json.load(open(resumed / "eval" / "test-step8.json"))
    assert {k: saved[k] for k in result} == result  # the file also keeps the examples
    _check_scores(result, root / "raw" / "test" / "manifest.jsonl")
    assert any(
        name.startswith("events.out.tfevents") for name in os.listdir(resumed / "tensorboard")
    )


def _check_scores(result: dict, manifest) -> None:
    """The result scores every utterance of the split against its own transcript: its
    utterance, word and character counts are those of the corpus's manifest (counted
    here from the raw text), and its rates are error counts over them."""
    texts = [" ".join(json.loads(line)["text"].split()) for line in open(manifest)]
    assert result["num_utts"] == len(texts)
    assert result["words"] == sum(len(t.split()) for t in texts)
    assert result["chars"] == sum(len(t) for t in texts)
    for rate, total in ((result["wer"], result["words"]), (result["cer"], result["chars"])):
        errors = rate * total  # an integer count of edits, rounded to 5 decimals in the rate
        assert abs(errors - round(errors)) <= 1e-5 * total and errors > 0, result


def test_transducer_head_trains_and_decodes_every_way(corpus):
    """A CTC+RNN-T model trains with the pruned loss, and every decoder scores the split
    (the command line once; the others in process on the 8-device mesh)."""
    root, shards = corpus
    workdir = root / "transducer"
    # One batch shape (utterances up to 3 s): one transducer step to compile, not two.
    out = train(workdir, shards, "--config.model.head=ctc+rnnt", *ONE_SHAPE).stdout
    assert "ctc+rnnt head" in out and "rnnt_pruned" in out and "eval step 8: dev" in out
    assert json.load(open(workdir / "eval" / "dev-step8.json"))["decoding"] == "rnnt_greedy"
    manifest = root / "raw" / "test" / "manifest.jsonl"
    ev = run(
        "jaxspeech.evaluate", "--workdir", str(workdir), "--split", "test", "--method",
        "rnnt_beam", "--beam", "2",
    )  # fmt: skip
    results = {"rnnt_beam": json.loads(ev.stdout.strip().splitlines()[-1])}
    for method in ("ctc_beam", "ctc_greedy"):
        results[method] = eval_run.evaluate_workdir(str(workdir), None, "test", None, method, 2)
    for method, result in results.items():
        assert result["decoding"] == method
        _check_scores(result, manifest)
        saved = json.load(open(workdir / "eval" / f"test-step8-{method}-beam2.json"))
        assert saved["cer"] == result["cer"]
    # Both beam searches with a trigram LM of the train transcripts fused in.
    lm_path = root / "transducer-lm.arpa"
    lm_build.build_lm(lm_build.read_sentences_from_split(str(shards), "train"), 3, str(lm_path))
    lm = {"lm_path": str(lm_path), "lm_weight": 0.5, "word_bonus": 1.0}
    for method in ("ctc_beam", "rnnt_beam"):
        result = eval_run.evaluate_workdir(str(workdir), None, "test", None, method, 2, decoding=lm)
        _check_scores(result, manifest)
        saved = workdir / "eval" / f"test-step8-{method}-beam2-transducer-lm-w0.5-b1.json"
        assert json.load(open(saved))["wer"] == result["wer"]
    # Long-form transcription with the transducer: word times from the frames RNN-T
    # greedy search emits labels at (two utterances in one file, cut at the pause).
    recs = reader.read_split_records(str(shards), "test", positions=[0, 1])
    pause = np.zeros(8000, np.float32)
    audio = np.concatenate([reader.audio_float32(recs[0]), pause, reader.audio_float32(recs[1])])
    sf.write(root / "transducer-two.wav", audio, 16000)
    config = eval_run.run_eval_config(str(workdir))
    got = []
    loaded = loading.load_run(str(workdir), config=config)
    assert transcribe_lib.transcribe_files(
        [str(root / "transducer-two.wav")], loaded, config, window_s=8.0, overlap_s=2.0, batch=8,
        emit=got.append,
    ) == 0  # fmt: skip
    starts = [w["start"] for w in got[0]["words"]]
    assert starts == sorted(starts) and all(0 <= t < len(audio) / 16000 for t in starts)
