"""A run's own assets (RUN/assets): the tokenizer and feature statistics copied from the
prepared corpus on the first run, checked against the data on every resume."""

from __future__ import annotations

import json
import math
import os
import shutil
import time

import jax
import numpy as np
from ml_collections import ConfigDict

from jaxspeech.audio.features import stats_to_mean_std
from jaxspeech.common import files, storage
from jaxspeech.common.errors import UserError
from jaxspeech.config import build
from jaxspeech.data.tokenizer import Tokenizer

ASSETS = "assets"  # RUN/assets: the run's own tokenizer and feature statistics


TOKENIZER = "tokenizer"


# ---------------------------------------------------------------- a run's assets
def install_assets(
    config: ConfigDict, workdir: str, every_process: bool = False
) -> tuple[str, np.ndarray, np.ndarray]:
    """Copy the data's tokenizer and feature statistics into RUN/assets (first run only).

    Returns (tokenizer dir, mean (F,), std (F,)). A resumed run keeps its own
    assets; if the data directory's tokenizer changed since, that is an error.
    every_process: each process writes its own copy (a run on an object store: each
    process works in its own local copy, runs/remote.py); else process 0 writes and the
    others wait for it on the shared file system.
    """
    split = config.data.train_split
    data_dir = storage.local_data(config.data.dir, TOKENIZER, split)  # a URL: its mirror
    src_tok = files.inside(data_dir, TOKENIZER, data_dir)
    split_dir = os.path.join(data_dir, split)
    stats_path = files.inside(split_dir, "stats.json", split_dir)
    check_tree(src_tok)  # copied into the run: nothing from outside the corpus comes along
    if os.path.exists(src_tok) and not os.path.isdir(split_dir):  # a corpus, not that split
        raise UserError(
            f"data.dir={data_dir!r} has no split {split!r} (data.train_split); its prepared "
            f"splits: {', '.join(prepared_splits(data_dir)) or 'none'}"
        )
    for p in (src_tok, stats_path):
        if not os.path.exists(p):
            raise UserError(
                f"{p} not found: data.dir={data_dir!r} is not a prepared corpus "
                f"(run `python -m data_prep.prepare ... --output {data_dir} --split {split}`)"
            )
    assets = os.path.join(workdir, ASSETS)
    dst_tok = os.path.join(assets, TOKENIZER)
    if (every_process or jax.process_index() == 0) and not os.path.exists(dst_tok):
        os.makedirs(assets, exist_ok=True)
        shutil.copytree(src_tok, dst_tok + ".tmp", dirs_exist_ok=True)
        with open(stats_path, "rb") as f:
            files.atomic_write(os.path.join(assets, "stats.json"), f.read())
        os.replace(dst_tok + ".tmp", dst_tok)
    wait_for(dst_tok)
    if Tokenizer.load(src_tok).vocab_size != Tokenizer.load(dst_tok).vocab_size:
        raise UserError(
            f"the tokenizer in {src_tok} differs from this run's ({dst_tok}); "
            "use a new --workdir for a re-prepared corpus"
        )
    mean, std = feature_stats(config, os.path.join(assets, "stats.json"), stats_path)
    return dst_tok, mean, std


def prepared_splits(data_dir: str) -> list[str]:
    """The splits prepared in `data_dir`: its directories with an index.json, sorted."""
    return sorted(
        d for d in os.listdir(data_dir) if os.path.isfile(os.path.join(data_dir, d, "index.json"))
    )


def check_tree(root: str) -> None:
    """Every file and directory under `root` lies inside it (`files.escape_reason`): a
    symlink in a dataset from elsewhere cannot make a copy of it read the user's files.

    Raises:
      UserError: the first entry that leads out, named.
    """
    for path, dirs, names in os.walk(root):
        for name in dirs + names:
            files.inside(root, os.path.relpath(os.path.join(path, name), root), root)


def feature_stats(config: ConfigDict, path: str, source: str) -> tuple[np.ndarray, np.ndarray]:
    """(mean (F,), std (F,)) of the run's stats.json at `path` (copied from `source`),
    checked against config.features.

    Raises:
      UserError: the statistics are of other features than the config's.
    """
    with open(path) as f:
        stats = json.load(f)
    differ = feature_differences(stats["feature"], build.feature_config(config).as_dict())
    if differ:
        got = ", ".join(f"{k}={v!r}" for k, (v, _) in differ.items())
        want = ", ".join(f"features.{k}={v!r}" for k, (_, v) in differ.items())
        raise UserError(
            f"feature statistics in {source} were computed with {got}, but the config "
            f"asks for {want}; re-run data_prep.prepare with matching feature flags "
            "(--features, --num_ceps, --lifter, --deltas, --num_mel_bins, ...)"
        )
    return stats_to_mean_std(stats["count"], stats["sum"], stats["sum_sq"])


def feature_differences(recorded: dict, expected: dict) -> dict[str, tuple]:
    """{setting: (recorded, expected)} where stats.json's "feature" record and the config's
    (`LogMelConfig.as_dict`) differ. A record without "kind" is a log-mel one (written
    before MFCC existed); when the kinds differ, that is the one difference named."""
    recorded, expected = {"kind": "log_mel"} | recorded, {"kind": "log_mel"} | expected
    if recorded["kind"] != expected["kind"]:
        return {"kind": (recorded["kind"], expected["kind"])}
    out = {}
    for k, v in expected.items():
        got = recorded.get(k)
        close = isinstance(v, float) and isinstance(got, int | float) and math.isclose(got, v)
        if got != v and not close:
            out[k] = (got, v)
    return out


def wait_for(path: str, timeout_s: float = 300.0) -> None:
    """Other processes wait for process 0 to install the assets (shared filesystem)."""
    t0 = time.time()
    while not os.path.exists(path):
        if time.time() - t0 > timeout_s:
            raise UserError(f"{path} did not appear: is RUN on a filesystem all hosts share?")
        time.sleep(0.5)
