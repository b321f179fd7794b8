"""A trained recognizer on waveforms in memory (synthesized speech, say), through the
evaluation's own decoding path: `search.make_decode_fn` and the `Searcher` of the run's
config.decoding (with the command line's overrides), `scoring.decode_batch`, the run's
tokenizer and text normalization (config.scoring). Texts are scored as the evaluation
scores them (`metrics.wer.ErrorCounts`).

Waveforms are decoded in batches of one fixed shape, `rows` x the longest waveform (or a
caller's `seconds`) rounded up to whole seconds: one compilation per width. Runs in one
process.
"""

from __future__ import annotations

import math

import jax
import numpy as np
import soxr
from ml_collections import ConfigDict

from jaxspeech.config import build
from jaxspeech.decoding import search
from jaxspeech.evaluation import run as eval_run
from jaxspeech.evaluation import scoring
from jaxspeech.metrics.wer import ErrorCounts
from jaxspeech.parallel import mesh as mesh_lib
from jaxspeech.parallel import rules
from jaxspeech.runs import loading

ROWS = 8  # waveforms decoded at once (rounded up to a multiple of the batch shards)


class WaveRecognizer:
    """`recognizer.transcribe(waves, sample_rate)` -> one normalized hypothesis per
    waveform, by a loaded recognizer run (`loading.Run`) and its (checked) config
    (`workdir`: where it came from, for reports)."""

    def __init__(
        self, run: loading.Run, config: ConfigDict, rows: int = ROWS, workdir: str | None = None
    ):
        self.run, self.config, self.workdir = run, config, workdir
        self.rules = build.rules_from_config(config)
        with rules.axis_rules(self.rules):
            unit = mesh_lib.num_batch_shards(run.spec.mesh)
            self.decode_fn = search.make_decode_fn(
                run.spec.graphdef, config, run.tokenizer.blank_id
            )
            self.searcher = search.Searcher(config, run.tokenizer, run.spec.graphdef)
            self.hypotheses = self.searcher.bind(run.params, run.model_vars)
        self.rows = unit * max(1, math.ceil(rows / unit))
        self.streams: dict[int, search.StreamDecoder] = {}  # by width: compiled once
        self.normalize = scoring.normalizer_from_config(config)
        self.sample_rate = int(config.features.sample_rate)

    @classmethod
    def from_workdir(
        cls,
        workdir: str,
        method: str | None = None,
        beam: int | None = None,
        decoding: dict | None = None,
    ) -> WaveRecognizer:
        """The latest checkpoint of recognizer RUN `workdir` with the command line's
        decoding overrides (`evaluation.run.run_eval_config`).

        Raises:
          FileNotFoundError, ValueError, CheckpointError: see `run_eval_config` and
            `loading.load_run`. UserError: a bad scoring.mapping_file; `workdir` is a
            synthesizer's run.
        """
        config = eval_run.run_eval_config(workdir, method, beam, None, decoding)
        if config.get("task", "asr") != "asr":
            raise ValueError(
                f"{workdir} is a config.task={config.task!r} run, not a recognizer: give "
                "--asr_workdir a speech recognition run"
            )
        with rules.axis_rules(build.rules_from_config(config)):
            run = loading.load_run(workdir, config=config)
        return cls(run, config, workdir=workdir)

    def transcribe(
        self, waves: list[np.ndarray], sample_rate: int, seconds: float = 0.0
    ) -> list[str]:
        """(S_i,) float waveforms in [-1, 1] at `sample_rate` Hz -> their normalized
        hypotheses, in order (resampled to the run's rate first where they differ).
        `seconds`: pad every batch to at least this long (one width, one compilation, for
        calls whose longest waveforms differ)."""
        if not waves:
            return []
        if sample_rate != self.sample_rate:
            waves = [soxr.resample(w, sample_rate, self.sample_rate) for w in waves]
        longest = max(max(len(w) for w in waves), int(math.ceil(seconds * self.sample_rate)))
        width = self.sample_rate * max(1, math.ceil(longest / self.sample_rate))
        run = self.run
        stream = self._stream(width) if self.config.decoding.get("streaming", False) else None
        out: list[str] = []
        with rules.axis_rules(self.rules), jax.set_mesh(run.spec.mesh):
            for start in range(0, len(waves), self.rows):
                part = waves[start : start + self.rows]
                batch = {
                    "audio": np.zeros((self.rows, width), np.float32),
                    "audio_len": np.zeros((self.rows,), np.int32),
                }
                for i, w in enumerate(part):
                    batch["audio"][i, : len(w)] = w
                    batch["audio_len"][i] = len(w)
                decoded = scoring.decode_batch(
                    batch, stream, self.decode_fn, run.params, run.model_vars, run.spec.mesh
                )
                ids = self.hypotheses(decoded)[: len(part)]
                out += [self.normalize(run.tokenizer.decode(h)) for h in ids]
        return out

    def _stream(self, width: int) -> search.StreamDecoder:
        """decoding.streaming: the stream decoder for audio up to `width` samples."""
        if width not in self.streams:
            run = self.run
            self.streams[width] = search.StreamDecoder(
                self.searcher.graphdef,
                run.params,
                run.model_vars,
                self.config,
                run.tokenizer.blank_id,
                width / self.sample_rate,
            )
        return self.streams[width]

    def score(self, counts: ErrorCounts, ref: str, hyp: str) -> dict[str, int]:
        """Adds `hyp` scored against the raw reference text `ref` (normalized as the run
        scores) to `counts`; returns the pair's counts (`ErrorCounts.add`: word_errors,
        words, char_errors, chars, ...)."""
        return counts.add(self.normalize(ref), hyp)
