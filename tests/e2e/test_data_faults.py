"""Damaged data at training and evaluation time, through the entry functions in process:
a skipped utterance is counted in the evaluation result, never silently left out of WER,
and too many unusable records stop training with the shard named. (Training through
damage, killed and resumed bit for bit, is tests/e2e/test_chaos.py.)"""

import json
import os
import shutil

import pytest

from jaxspeech import tasks
from jaxspeech.common.errors import UserError
from jaxspeech.config.build import mesh_from_config
from jaxspeech.data import records
from jaxspeech.evaluation import run as eval_run
from jaxspeech.parallel import rules
from jaxspeech.runs import events, faults
from jaxspeech.training import inputs
from tests.data import damage
from tests.e2e.cli import tiny_config

pytestmark = pytest.mark.slow


def _damaged_copy(shards, dest, split: str, record: int) -> tuple[str, int]:
    """A copy of the prepared corpus with global record `record` of `split` replaced by an
    undecodable one. Returns (the damaged shard, the record's index in it)."""
    shutil.copytree(shards, dest)
    index = records.read_split_index(str(dest), split)
    start = 0
    for path, n in zip(index.shard_paths, index.shard_num_records):
        if record < start + n:
            old = damage.read_all(path)[record - start]
            damage.replace_record(path, record - start, damage.undecodable(old))
            return path, record - start
        start += n
    raise AssertionError(f"no record {record}")


def test_evaluation_counts_unreadable_utterances_and_refuses_a_damaged_split(
    corpus, tiny_run_copy, tmp_path
):
    _, shards = corpus
    data = tmp_path / "data"
    shard, index = _damaged_copy(shards, data, "dev", 3)
    total = records.read_split_index(str(data), "dev").num_records
    run = str(tiny_run_copy)
    with pytest.raises(faults.CorpusDamaged) as e:  # the run's limit: 0.1% of the split
        eval_run.evaluate_workdir(run, str(data), "dev", None)
    assert str(e.value).startswith(
        f"1 of the {total} records of dev could not be read or decoded in epoch 0"
    )
    assert f"{shard} (1 bad)" in str(e.value)
    result = eval_run.evaluate_workdir(run, str(data), "dev", None, max_corrupt_fraction=0.5)
    assert result["skipped_unreadable"] == 1 and result["num_utts"] == total - 1
    saved = json.load(open(os.path.join(run, "eval", f"dev-step{result['step']}.json")))
    assert saved["skipped_unreadable"] == 1


def test_training_stops_past_the_corrupt_fraction_naming_the_shard(corpus, tmp_path):
    _, shards = corpus
    config = tiny_config(str(tmp_path / "data"), "--config.data.max_corrupt_fraction=0")
    # Damage a record of the first batch: the run meets it at step 1.
    with rules.axis_rules(rules.DEFAULT_RULES):
        pipe, _ = inputs.train_pipeline(
            tiny_config(str(shards)), mesh_from_config(config), str(shards / "tokenizer")
        )
    first = int(next(i for i in pipe.plan[0].indices if i >= 0))
    shard, index = _damaged_copy(shards, tmp_path / "data", "train", first)
    workdir = tmp_path / "run"
    with pytest.raises(faults.CorpusDamaged) as e:
        tasks.train_and_evaluate(config, str(workdir))
    msg = str(e.value)
    total = records.read_split_index(str(tmp_path / "data"), "train").num_records
    assert msg.startswith(
        f"1 of the {total} records of train could not be read or decoded in epoch 0"
    )
    assert f"{shard} (1 bad)" in msg and "data_prep.verify" in msg
    names = [ev["event"] for ev in events.read_events(str(workdir))]
    assert names[-3:] == ["records_skipped", "corpus_damaged", "failed"]
    (line,) = open(workdir / "data_faults" / "p0.jsonl").read().splitlines()
    assert json.loads(line) | {"error": ""} == {
        "step": 1,
        "record": first,
        "shard": shard,
        "index": index,
        "error": "",
    }


def test_a_missing_or_truncated_shard_stops_training_before_any_work(corpus, tmp_path):
    _, shards = corpus
    data = tmp_path / "data"
    shutil.copytree(shards, data)
    index = records.read_split_index(str(data), "train")
    for path in index.shard_paths:  # the tiny corpus has one train shard: cut it, then lose it
        damage.truncate(path)
    workdir = tmp_path / "run"
    config = tiny_config(str(data))
    with pytest.raises(UserError, match="unreadable") as e:
        tasks.train_and_evaluate(config, str(workdir))
    assert index.shard_paths[0] in str(e.value) and "data_prep.verify" in str(e.value)
    os.remove(index.shard_paths[0])
    with pytest.raises(UserError, match=f"{index.shard_paths[0]}: missing"):
        tasks.train_and_evaluate(config, str(workdir))
    assert not (workdir / "checkpoints").exists()  # nothing was compiled or saved
