"""The synthesizer's in-loop evaluation and samples.

`evaluate_split`: every utterance of a split through the teacher-forced model (its
durations, pitch and energy targets): mel L1 in the model's normalized units (the
training loss's mel part) and in decibels of log-mel power, the duration predictor's
error in frames per phoneme; then `config.tts.mcd_utterances` of them synthesized from
their phonemes alone (the model's own durations) and scored by MCD-DTW (dB,
`jaxspeech.metrics.speech.mcd_dtw`) against their real features. Per-utterance rows go to
RUN/eval/<split>-step<N>-utts.jsonl, as the recognizer's.

`TtsSamples`: a training row's target, teacher-forced and synthesized mel side by side in
TensorBoard, and the synthesized one as RUN/samples/step<N>.wav (Griffin-Lim).
"""

from __future__ import annotations

import math
import os
import time

import jax
import numpy as np
import soundfile as sf
from jax.sharding import Mesh
from ml_collections import ConfigDict

from jaxspeech.audio.features import LogMelConfig, num_frames
from jaxspeech.audio.griffin_lim import griffin_lim
from jaxspeech.common.errors import UserError
from jaxspeech.config import build
from jaxspeech.data import records
from jaxspeech.evaluation import splits as eval_splits
from jaxspeech.metrics import images
from jaxspeech.metrics.speech import mcd_dtw, mel_cepstrum_of_log_mel
from jaxspeech.metrics.writers import MetricWriter
from jaxspeech.parallel import mesh as mesh_lib
from jaxspeech.runs import faults
from jaxspeech.runs.events import log
from jaxspeech.tts import batch as tts_batch
from jaxspeech.tts.assets import TtsAssets
from jaxspeech.tts.loading import denormalized
from jaxspeech.tts.model import make_synthesize_fn
from jaxspeech.tts.objective import make_eval_fn

SAMPLES_DIR = "samples"  # RUN/samples/step<N>.wav
ROW_SUMS = ("mel_abs", "mel_abs_db", "frames", "phonemes", "duration_abs")


class TtsEvaluator:
    """The synthesizer's evaluation and samples, compiled once per batch shape: the
    teacher-forced model per eval bucket, and one fixed shape (the longest training
    bucket, `unit_rows` rows) for synthesis, shared by samples and MCD."""

    def __init__(self, config: ConfigDict, mesh: Mesh, graphdef, assets: TtsAssets):
        self.config, self.mesh, self.assets = config, mesh, assets
        self.cfg: LogMelConfig = build.feature_config(config)
        self.eval_fn = make_eval_fn(graphdef, self.cfg)
        spec = build.train_bucket_spec(config, mesh)
        last = len(spec.boundaries) - 1
        self.samples_n, self.tokens_n = spec.num_samples(last), spec.max_labels[last]
        self.frames_n = int(num_frames(self.samples_n, self.cfg.hop_length))
        # Twice the longest training utterance: room for slow predicted durations.
        self.synthesize = make_synthesize_fn(graphdef, 2 * self.frames_n)
        self.rows = mesh_lib.unit_rows(mesh, max(config.monitor.num_samples, 1))

    # ------------------------------------------------------------------ one split
    def evaluate_split(
        self, split: str, params: dict, model_vars: dict, fault_log: faults.FaultLog
    ) -> dict:
        """The split's scores (see the module docstring); the caller holds the mesh.

        Raises:
          UserError: a speaker of the split is not in the run's speaker table.
          CorpusDamaged: more unusable records than data.max_corrupt_fraction.
        """
        t0 = time.time()
        pipe = self._pipeline(split)
        rows, mcd_rows, skipped = [], [], 0
        want = self._mcd_per_process()
        try:
            for batch in pipe.dataset():
                fault_log.add(batch["faults"])
                skipped += int(np.sum(batch["corrupt"]) + np.sum(batch["label_overflow"]))
                arrays = {k: v for k, v in batch.items() if isinstance(v, np.ndarray)}
                out = self.eval_fn(params, model_vars, mesh_lib.host_to_global(self.mesh, arrays))
                out = {k: mesh_lib.to_host_local(self.mesh, v) for k, v in out.items()}
                for i, utt in enumerate(batch["id"]):
                    if not utt or not batch["weight"][i]:
                        continue
                    rows.append({"id": utt} | {k: float(out[k][i]) for k in ROW_SUMS})
                    if len(mcd_rows) < want and batch["token_len"][i] <= self.tokens_n:
                        n = int(out["frames"][i])
                        mcd_rows.append(
                            (utt, batch["tokens"][i], batch["speaker"][i], out["target"][i, :n])
                        )
        except tts_batch.UnknownSpeaker as e:
            raise UserError(
                f"evaluating {split}: {e}; a synthesizer speaks only its training voices: "
                "evaluate on a split of train speakers (config.data.eval_split)"
            ) from e
        mcd = self._mcd(mcd_rows, params, model_vars)
        return self._result(split, pipe.index, rows, mcd, skipped, fault_log, t0)

    def _pipeline(self, split: str):
        config, mesh = self.config, self.mesh
        index = records.read_split_index(config.data.dir, split)
        return tts_batch.make_tts_pipeline(
            data_dir=config.data.dir,
            split=split,
            table=self.assets.table,
            speakers=self.assets.speakers,
            spec=eval_splits.split_buckets(config, mesh, index),
            hop_length=self.cfg.hop_length,
            **build.loader_settings(config, train=False),
        )

    def _mcd_per_process(self) -> int:
        return math.ceil(int(self.config.tts.mcd_utterances) / jax.process_count())

    def _mcd(self, mcd_rows: list, params: dict, model_vars: dict) -> dict[str, float]:
        """{utterance id: MCD-DTW dB} of this process's `mcd_rows` (id, (N,) tokens,
        speaker, (T, M) normalized target), synthesized in fixed groups (every process
        runs the same number of them: they are collectives)."""
        local = self.rows // jax.process_count()
        groups = math.ceil(self._mcd_per_process() / local)
        out = {}
        for g in range(groups):
            part = mcd_rows[g * local : (g + 1) * local]
            tokens = np.zeros((local, self.tokens_n), np.int32)
            speaker = np.zeros((local,), np.int32)
            for i, (_, tok, spk, _) in enumerate(part):
                tokens[i, : len(tok)], speaker[i] = tok[: self.tokens_n], spk
            mel, frames = self._synthesize(params, tokens, speaker)
            for i, (utt, _, _, target) in enumerate(part):
                n = int(frames[i])
                if n and len(target):
                    ref = mel_cepstrum_of_log_mel(denormalized(target, model_vars))
                    syn = mel_cepstrum_of_log_mel(denormalized(mel[i, :n], model_vars))
                    out[utt] = mcd_dtw(ref, syn)
        return out

    def _synthesize(self, params, tokens: np.ndarray, speaker: np.ndarray):
        arrays = mesh_lib.host_to_global(self.mesh, {"tokens": tokens, "speaker": speaker})
        mel, frames = self.synthesize(params, arrays["tokens"], arrays["speaker"])
        return mesh_lib.to_host_local(self.mesh, mel), mesh_lib.to_host_local(self.mesh, frames)

    def _result(self, split, index, rows, mcd, skipped, fault_log, t0) -> dict:
        """All processes' rows -> the split's result (frame- and phoneme-weighted means)."""
        for row in rows:
            if row["id"] in mcd:
                row["mcd_dtw_db"] = round(mcd[row["id"]], 4)
        rows, skipped = eval_splits.gather_rows(self.config, split, index, rows, skipped, fault_log)
        total = {k: float(sum(r[k] for r in rows)) for k in ROW_SUMS}
        bins = total["frames"] * self.cfg.num_mel_bins
        scored = [r["mcd_dtw_db"] for r in rows if "mcd_dtw_db" in r]
        return {
            "split": split,
            "num_utts": len(rows),
            "skipped": skipped,
            "mel_l1": round(total["mel_abs"] / max(bins, 1.0), 5),
            "mel_l1_db": round(total["mel_abs_db"] / max(bins, 1.0), 4),
            "duration_error_frames": round(total["duration_abs"] / max(total["phonemes"], 1.0), 4),
            "mcd_dtw_db": round(float(np.mean(scored)), 4) if scored else None,
            "mcd_utterances": len(scored),
            "eval_seconds": round(time.time() - t0, 1),
            "utterances": [_row(r, self.cfg.num_mel_bins) for r in rows],
        }

    # ------------------------------------------------------------------ samples
    def samples(
        self,
        step: int,
        params: dict,
        model_vars: dict,
        local: dict,
        writer: MetricWriter,
        workdir: str,
    ) -> None:
        """A training row's target, teacher-forced and synthesized mel (TensorBoard image
        "tts/mel_target_forced_synthesized") and its synthesis as RUN/samples/step<N>.wav."""
        rows = peek_tts_rows(
            local,
            self.rows // jax.process_count(),
            self.samples_n,
            self.tokens_n,
            self.cfg.hop_length,
        )
        with jax.set_mesh(self.mesh):
            out = self.eval_fn(params, model_vars, mesh_lib.host_to_global(self.mesh, rows))
            out = {k: mesh_lib.to_host_local(self.mesh, v) for k, v in out.items()}
            mel, frames = self._synthesize(params, rows["tokens"], rows["speaker"])
        if jax.process_index() != 0 or not rows["weight"][0]:
            return
        n, m = int(out["frames"][0]), int(frames[0])
        target = denormalized(out["target"][0, :n], model_vars)
        forced = denormalized(out["predicted"][0, :n], model_vars)
        synthesized = denormalized(mel[0, :m], model_vars)
        lo, hi = np.percentile(target, 1), np.percentile(target, 99)
        pictures = [
            images.spectrogram_image(x, lo=lo, hi=hi)
            for x in (target, forced, synthesized)
            if len(x)
        ]
        writer.image(step, "tts/mel_target_forced_synthesized", images.stack_images(pictures))
        path = os.path.join(workdir, SAMPLES_DIR, f"step{step}.wav")
        if m:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            sf.write(
                path, griffin_lim(synthesized, self.cfg), self.cfg.sample_rate, subtype="PCM_16"
            )
        log(
            f"samples at step {step}: {n} target frames, {m} synthesized from "
            f"{int(rows['token_len'][0])} phonemes; mel images in TensorBoard"
            + (f", audio {path} (Griffin-Lim)" if m else "")
        )


def _row(r: dict, bins: int) -> dict:
    """An utterance's line of RUN/eval/...-utts.jsonl."""
    out = {
        "id": r["id"],
        "frames": int(r["frames"]),
        "phonemes": int(r["phonemes"]),
        "mel_l1": round(r["mel_abs"] / max(r["frames"] * bins, 1.0), 5),
        "mel_l1_db": round(r["mel_abs_db"] / max(r["frames"] * bins, 1.0), 4),
        "duration_error_frames": round(r["duration_abs"] / max(r["phonemes"], 1.0), 4),
    }
    return out | ({"mcd_dtw_db": r["mcd_dtw_db"]} if "mcd_dtw_db" in r else {})


def peek_tts_rows(local: dict, rows: int, samples: int, tokens: int, hop: int) -> dict:
    """The first `rows` rows of a host-local text-to-speech batch in one fixed shape
    (audio and pitch cut or padded to `samples`, phonemes to `tokens`; a row that no
    longer fits gets weight 0): one compilation whatever the bucket."""
    out = tts_batch.empty_tts_batch(rows, samples, tokens, hop)
    have = min(rows, local["audio"].shape[0])
    for i in range(have):
        fits = local["audio_len"][i] <= samples and local["token_len"][i] <= tokens
        if not (local["weight"][i] and fits):
            continue
        for k in ("audio", "pitch", "tokens", "durations"):
            width = min(out[k].shape[1], local[k].shape[1])
            out[k][i, :width] = local[k][i, :width]
        for k in ("audio_len", "token_len", "speaker", "weight"):
            out[k][i] = local[k][i]
    return out
