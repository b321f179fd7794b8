"""The periodic WER job (`python -m jaxspeech.evaluate --watch`) on a copy of the shared
finished tiny run: every checkpoint scored once per split, with its per-utterance
report; a restarted watcher scores only what is missing; an unfinished run ends at the
timeout. The in-loop evaluation of several splits is checked on the tiny run itself."""

import json

from jaxspeech.evaluation import watcher as eval_watch
from jaxspeech.runs import events as run_events
from tests.e2e.cli import run_module

SPLITS = ["dev", "test"]


def _utterances(run, split, step):
    path = run / "eval" / f"{split}-step{step}-utts.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_the_watcher_scores_every_checkpoint_once_per_split_and_resumes(corpus, tiny_run_copy):
    _, shards = corpus
    run = tiny_run_copy
    # The in-loop evaluation scored both of the tiny run's splits at its last step (the
    # first split's WER is the one that ranks checkpoints).
    evaluated = [e for e in run_events.read_events(str(run)) if e["event"] == "evaluated"]
    assert [(e["split"], e["step"]) for e in evaluated] == [("dev", 8), ("test", 8)]

    got = eval_watch.watch(str(run), str(shards), SPLITS, poll_s=0)
    assert got["reason"] == "finished"
    assert got["done"] == {"dev": [4, 8], "test": [4, 8]} and got["skipped"] == {}
    for split in SPLITS:
        for step in (4, 8):
            result = json.load(open(run / "eval" / f"{split}-step{step}.json"))
            rows = _utterances(run, split, step)
            # The per-utterance report adds up to the result, error type by error type.
            assert len(rows) == result["num_utts"] > 0
            for key in ("words", "chars", "word_sub", "word_del", "word_ins", "char_sub"):
                assert sum(r[key] for r in rows) == result[key], key
            errors = sum(r["word_errors"] for r in rows)
            assert abs(errors / result["words"] - result["wer"]) < 1e-5
            lo, hi = result["wer_ci95"]
            assert lo <= result["wer"] <= hi
            worst = max(r["word_errors"] for r in rows)
            assert result["worst"][0]["word_errors"] == worst
    scores = [json.loads(line) for line in open(run / "eval" / "watch_metrics.jsonl")]
    assert [(s["step"], sorted(s)) for s in scores] == [
        (4, ["eval/dev/cer", "eval/dev/wer", "step"]),
        (4, ["eval/test/cer", "eval/test/wer", "step"]),
        (8, ["eval/dev/cer", "eval/dev/wer", "step"]),
        (8, ["eval/test/cer", "eval/test/wer", "step"]),
    ]
    # The final checkpoint scores as the training loop scored it.
    final = json.load(open(run / "eval" / "test-step8.json"))
    assert final["wer"] == evaluated[1]["wer"] and final["cer"] == evaluated[1]["cer"]

    # A watcher restarted after a kill scores only what it had not recorded as done.
    progress = json.load(open(run / "eval" / "watch.json"))
    progress["done"]["test"].remove(8)
    (run / "eval" / "watch.json").write_text(json.dumps(progress))
    out = run_module(
        "jaxspeech.evaluate", "--workdir", str(run), "--data", str(shards),
        "--split", "dev,test", "--watch", "--watch_poll_s", "0",
    ).stdout  # fmt: skip
    assert "eval step 8: test" in out
    assert "eval step 4" not in out and "eval step 8: dev" not in out
    assert json.load(open(run / "eval" / "watch.json"))["done"]["test"] == [4, 8]

    # A run that has not finished: once nothing is left to score, the watcher waits for
    # new checkpoints until --watch_timeout.
    events = (run / "events.jsonl").read_text().splitlines()
    unfinished = [e for e in events if json.loads(e)["event"] != "finished"]
    (run / "events.jsonl").write_text("\n".join(unfinished) + "\n")
    got = eval_watch.watch(str(run), str(shards), SPLITS, timeout_s=0.3, poll_s=0.05)
    assert got["reason"] == "timeout"
