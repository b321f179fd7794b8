import json

import numpy as np
import pytest

from configs import demo
from jaxspeech.common.errors import UserError
from jaxspeech.decoding import search
from jaxspeech.evaluation import watcher as eval_watch
from jaxspeech.evaluation.run import result_tag, run_eval_config
from jaxspeech.evaluation.scoring import normalizer_from_config, summarize_utterances, write_result
from jaxspeech.evaluation.splits import eval_bucket_spec, parse_splits


def test_eval_buckets_cover_the_longest_utterance():
    config = demo.get_config()
    config.data.eval_bucket_boundaries = (3.0, 6.5)
    spec = eval_bucket_spec(config, np.array([1.0, 4.0, 9.2], np.float32), multiple_of=2)
    assert spec.boundaries == (3.0, 6.5, 10.0)
    assert all(bs % 2 == 0 for bs in spec.batch_sizes)
    # Without eval buckets the training buckets are used; no extra bucket when all fit.
    config.data.eval_bucket_boundaries = None
    spec = eval_bucket_spec(config, np.array([1.0, 2.0], np.float32), multiple_of=1)
    assert spec.boundaries == tuple(config.data.bucket_boundaries)


def _row(utt_id, word_errors, words, char_errors=0, chars=10):
    return {
        "id": utt_id,
        "ref": f"ref {utt_id}",
        "hyp": f"hyp {utt_id}",
        "word_errors": word_errors,
        "words": words,
        "char_errors": char_errors,
        "chars": chars,
    }


def test_summary_has_intervals_around_the_rates_and_the_worst_utterances_first():
    config = demo.get_config()
    config.scoring.worst = 2
    rng = np.random.default_rng(0)
    rows = [
        _row(f"u{i}", int(rng.integers(0, 4)), 8, int(rng.integers(0, 6)), 30) for i in range(300)
    ]
    rows[7]["word_errors"], rows[9]["word_errors"] = 8, 8
    rows[9]["char_errors"] = 29
    got = summarize_utterances(rows, config)
    wer = sum(r["word_errors"] for r in rows) / sum(r["words"] for r in rows)
    cer = sum(r["char_errors"] for r in rows) / sum(r["chars"] for r in rows)
    assert got["wer_ci95"][0] < wer < got["wer_ci95"][1]
    assert got["cer_ci95"][0] < cer < got["cer_ci95"][1]
    # Most word errors first; ties broken by character errors.
    assert [w["id"] for w in got["worst"]] == ["u9", "u7"]
    assert set(got["worst"][0]) == {"id", "ref", "hyp", "word_errors", "words"}
    config.scoring.bootstrap_samples = 0
    assert "wer_ci95" not in summarize_utterances(rows, config)


def test_splits_and_the_scoring_settings_are_checked(tmp_path):
    assert parse_splits("dev, test") == ["dev", "test"]
    for bad in ("dev,,test", "dev,dev", ""):
        with pytest.raises(UserError, match="distinct names"):
            parse_splits(bad)
    config = demo.get_config()
    config.scoring.lowercase = config.scoring.remove_punctuation = True
    mapping = tmp_path / "map.tsv"
    mapping.write_text("okay\tok\n")
    config.scoring.mapping_file = str(mapping)
    assert normalizer_from_config(config)("Okay, FINE.") == "ok fine"
    config.scoring.mapping_file = str(tmp_path / "missing.tsv")
    with pytest.raises(UserError, match="scoring.mapping_file"):
        normalizer_from_config(config)
    del config["scoring"]  # a run that predates the key: scored as before
    assert normalizer_from_config(config)("Okay, FINE.") == "Okay, FINE."


def test_write_result_keeps_utterances_in_their_own_file(tmp_path):
    rows = [_row("a", 1, 3), _row("b", 0, 2)]
    result = {"split": "dev", "wer": 0.2, "examples": [], "utterances": rows}
    path = write_result(str(tmp_path), result, 7)
    assert path == str(tmp_path / "eval" / "dev-step7.json")
    saved = json.load(open(path))
    assert "utterances" not in saved and saved["step"] == 7 and saved["wer"] == 0.2
    lines = (tmp_path / "eval" / "dev-step7-utts.jsonl").read_text().splitlines()
    assert [json.loads(line) for line in lines] == rows
    assert result["utterances"] == rows  # the caller's result is left as it was


def test_the_watcher_plans_each_missing_split_of_each_step_once(tmp_path):
    progress = eval_watch.load_progress(str(tmp_path), ["dev", "test"])
    assert progress == {"done": {"dev": [], "test": []}, "skipped": {}}
    progress["done"]["dev"] = [4]
    progress["skipped"]["6"] = "removed"
    assert eval_watch.pending([8, 4, 6], ["dev", "test"], progress) == [
        (4, ["test"]),
        (8, ["dev", "test"]),
    ]
    eval_watch.save_progress(str(tmp_path), progress)
    again = eval_watch.load_progress(str(tmp_path), ["dev", "test", "other"])
    assert again["done"] == {"dev": [4], "test": [], "other": []}
    assert again["skipped"] == {"6": "removed"}
    assert not list((tmp_path / "eval").glob("*.tmp"))


def test_lm_overrides_are_checked_and_tag_the_result_files(tmp_path):
    config = demo.get_config("ctc")  # a CTC run: its beam search is ctc_beam
    for key in ("lm_path", "lm_weight", "word_bonus"):
        del config.decoding[key]  # a run from before LM fusion
    (tmp_path / "config.json").write_text(config.to_json())
    plain = run_eval_config(str(tmp_path))
    assert plain.decoding.lm_path == "" and result_tag(plain, None, None) == ""
    lm = {"lm_path": "/lms/news-4gram.arpa", "lm_weight": 0.7, "word_bonus": None}
    fused = run_eval_config(str(tmp_path), "ctc_beam", 8, None, lm)
    assert (fused.decoding.lm_weight, fused.decoding.word_bonus) == (0.7, search.WORD_BONUS)
    tag = result_tag(fused, "ctc_beam", 8, lm)
    assert tag == f"-ctc_beam-beam8-news-4gram-w0.7-b{search.WORD_BONUS:g}"
    with pytest.raises(ValueError, match="LM fusion needs one of"):
        run_eval_config(str(tmp_path), "ctc_greedy", None, None, lm)
    auto = run_eval_config(str(tmp_path), None, None, None, lm)  # auto: the beam search
    assert search.decoding_method(auto) == "ctc_beam"
    chunked = run_eval_config(str(tmp_path), None, None, None, {"chunk_size": 8, "streaming": True})
    assert chunked.model.conformer.chunk_size == 8 and chunked.decoding.streaming
    tag = result_tag(chunked, None, None, {"chunk_size": 8, "streaming": True})
    assert tag == "-ctc_greedy-beam4-chunk8-streaming"


def test_a_beam_of_zero_is_refused_not_ignored(tmp_path):
    """--beam 0 once fell through `if beam:` to the run's beam (and wrote the untagged
    result file); it is refused like -1."""
    (tmp_path / "config.json").write_text(demo.get_config().to_json())
    for beam in (0, -1):
        with pytest.raises(ValueError, match=f"decoding.beam.*{beam}"):
            run_eval_config(str(tmp_path), None, beam)
    config = run_eval_config(str(tmp_path), None, 1)
    assert config.decoding.beam == 1 and result_tag(config, None, 1).endswith("-beam1")


def test_a_beam_too_wide_for_the_memory_is_refused():
    """Checked when the searcher is built (before any batch is decoded), one line; a beam
    wider than the vocabulary is not a mistake (prefixes outnumber labels)."""
    import types

    from jaxspeech.common.errors import UserError

    config = demo.get_config()  # rnnt_beam
    config.decoding.beam = 100_000
    tokens = types.SimpleNamespace(blank_id=0, vocab_size=40)
    with pytest.raises(UserError, match="decoding.beam 100000: rnnt_beam would need"):
        search.Searcher(config, tokens)
    config.decoding.beam = 64
    assert search.beam_mistake(config, 40, 16 * 2**30) == ""
    config.decoding.beam = 4000
    found = search.beam_mistake(config, 5000, 16 * 2**30)
    assert "GiB" in found and "over half of the 16.0 GiB" in found
    config.decoding.method = "aed_beam"
    config.model.head = "ctc+aed"
    config.decoding.beam = 500  # the joint CTC scorer: (B*K, 1.5K, T, 2)
    assert "aed_beam would need" in search.beam_mistake(config, 5000, 16 * 2**30)
    config.decoding.method = "rnnt_greedy"
    config.model.head = "rnnt"
    assert search.beam_mistake(config, 40, 1) == ""  # greedy: no beam
