"""Shared by the text-to-speech tests: the tiny corpus (tests/tts/corpus.py) and one
finished tiny run of configs/tts.py:tiny on it, each built once per test session for
every pytest-xdist worker (`tests.sharing.built_once`), and one tiny vocoder run of
configs/vocoder.py:tiny on that corpus. Users copy a run before changing it."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.e2e.cli import run_module, session_overrides, tts_train_args
from tests.sharing import built_once
from tests.tts import corpus


@pytest.fixture(scope="session")
def tts_corpus(tmp_path_factory) -> Path:
    """The prepared tiny corpus: train (8 utterances of each of 3 speakers) and dev (2)."""
    root, _ = built_once(
        tmp_path_factory, "tts-corpus", lambda d: corpus.write_corpus(str(d / "shards"))
    )
    return root / "shards"


@pytest.fixture(scope="session")
def tts_tiny_run(tts_corpus, tmp_path_factory) -> tuple[Path, str]:
    """One finished run of configs/tts.py:tiny, evaluated on dev (it ranks the
    checkpoints) and on train (the durations it fitted). Returns (run, console output)."""

    def build(where: Path) -> str:
        args = tts_train_args(where / "run", tts_corpus, "--config.data.eval_split=dev,train")
        out = run_module("jaxspeech.train", *args)
        return out.stdout + out.stderr

    where, out = built_once(tmp_path_factory, "tts-tiny-run", build)
    return where / "run", out


@pytest.fixture(scope="session")
def vocoder_tiny_run(tts_corpus, tmp_path_factory) -> tuple[Path, str]:
    """One finished run of configs/vocoder.py:tiny (Vocos, config.task=vocoder) on the
    tiny corpus, evaluated on dev. Returns (run, console output)."""

    def build(where: Path) -> str:
        args = [
            "--config",
            "configs/vocoder.py:tiny",
            "--workdir",
            str(where / "run"),
            f"--config.data.dir={tts_corpus}",
            *session_overrides(),
        ]
        out = run_module("jaxspeech.train", *args)
        return out.stdout + out.stderr

    where, out = built_once(tmp_path_factory, "vocoder-tiny-run", build)
    return where / "run", out
