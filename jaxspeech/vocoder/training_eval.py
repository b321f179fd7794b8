"""The vocoder's in-loop evaluation and samples.

`evaluate_split`: every utterance of a split vocoded whole from its own real log-mel
(the run's front end) and scored against the recording: log-mel L1 (natural log of mel
power, over each utterance's 1 + S // hop frames x bins; the training loss's mel part).
The first `config.vocoder.eval_utterances` of them are also vocoded by Griffin-Lim
(`audio.griffin_lim`, the baseline that needs no training) and both vocoders' speech is
scored by log-mel L1 (host features, `audio.features.reference_log_mel`) and MCD-DTW
(`metrics.speech.mcd_dtw_waves`): the comparison on the same utterances. Per-utterance rows
go to RUN/eval/<split>-step<N>-utts.jsonl, as the other tasks'.

`samples`: a training row's segment vocoded: RUN/samples/step<N>.wav, TensorBoard audio
and its real and vocoded log-mel as one image.
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

from jaxspeech.audio.features import reference_log_mel
from jaxspeech.audio.griffin_lim import griffin_lim
from jaxspeech.config import build
from jaxspeech.data import records
from jaxspeech.evaluation import splits as eval_splits
from jaxspeech.metrics import images
from jaxspeech.metrics.speech import mcd_dtw_waves
from jaxspeech.metrics.writers import MetricWriter
from jaxspeech.parallel import mesh as mesh_lib
from jaxspeech.runs import faults
from jaxspeech.runs.events import log
from jaxspeech.vocoder import batch as vocoder_batch
from jaxspeech.vocoder.objective import make_eval_fn

SAMPLES_DIR = "samples"  # RUN/samples/step<N>.wav


def host_mel_l1(ref_audio: np.ndarray, wave: np.ndarray, cfg) -> float:
    """Mean |log-mel difference| of a vocoded (S2,) waveform against the (S,) recording,
    over the recording's frames (the vocoded speech cut or zero-padded to S samples)."""
    wave = np.pad(wave[: len(ref_audio)], (0, max(0, len(ref_audio) - len(wave))))
    return float(np.mean(np.abs(reference_log_mel(ref_audio, cfg) - reference_log_mel(wave, cfg))))


def mcd_or_none(ref_audio: np.ndarray, wave: np.ndarray, sr: int) -> float | None:
    try:
        return round(mcd_dtw_waves(ref_audio, wave, sr), 4)
    except ValueError:  # a silent waveform has no cepstrum to compare
        return None


class VocoderEvaluator:
    """The vocoder's evaluation and samples: the generator compiled once per eval bucket
    and once for the samples' shape (the training segment)."""

    def __init__(self, config: ConfigDict, mesh: Mesh, gen_graphdef):
        self.config, self.mesh = config, mesh
        self.cfg = build.feature_config(config)
        self.eval_fn = make_eval_fn(gen_graphdef, self.cfg)
        self.rows = mesh_lib.unit_rows(mesh, max(config.monitor.num_samples, 1))

    def evaluate_split(
        self, split: str, params: dict, model_vars: dict, fault_log: faults.FaultLog
    ) -> dict:
        """The split's scores (see the module docstring); the caller holds the mesh.

        Raises:
          CorpusDamaged: more unusable records than data.max_corrupt_fraction.
        """
        del model_vars  # the front end's settings: the config's (checked at load)
        t0 = time.time()
        pipe = self._pipeline(split)
        want = math.ceil(int(self.config.vocoder.eval_utterances) / jax.process_count())
        rows, compared, skipped = [], {}, 0
        for batch in pipe.dataset():
            fault_log.add(batch["faults"])
            skipped += int(np.sum(batch["corrupt"]))
            arrays = mesh_lib.host_to_global(
                self.mesh, {k: batch[k] for k in ("audio", "audio_len")}
            )
            out = self.eval_fn(params["generator"], arrays["audio"], arrays["audio_len"])
            out = {k: mesh_lib.to_host_local(self.mesh, v) for k, v in out.items()}
            for i, utt in enumerate(batch["id"]):
                if not utt or not batch["weight"][i]:
                    continue
                frames = float(out["frames"][i])
                row = {"id": utt, "frames": int(frames)}
                row["mel_l1"] = round(
                    float(out["mel_abs"][i]) / (frames * self.cfg.num_mel_bins), 5
                )
                rows.append(row)
                if len(compared) < want:
                    n = int(batch["audio_len"][i])
                    mel = out["mel"][i, : int(frames)]
                    compared[utt] = self._compare(batch["audio"][i, :n], out["vocoded"][i], mel)
        for row in rows:
            row |= compared.get(row["id"], {})
        return self._result(split, pipe.index, rows, skipped, fault_log, t0)

    def _pipeline(self, split: str):
        config, mesh = self.config, self.mesh
        index = records.read_split_index(config.data.dir, split)
        return vocoder_batch.make_vocoder_pipeline(
            data_dir=config.data.dir,
            split=split,
            spec=eval_splits.split_buckets(config, mesh, index),
            segment_samples=0,
            batch_size=0,
            **build.loader_settings(config, train=False),
        )

    def _compare(self, audio: np.ndarray, vocoded: np.ndarray, mel: np.ndarray) -> dict:
        """Both vocoders on one utterance: log-mel L1 and MCD-DTW against the recording."""
        sr = self.cfg.sample_rate
        gl = griffin_lim(mel, self.cfg)[: len(audio)]
        vocoded = vocoded[: len(audio)]
        return {
            "mel_l1_host": round(host_mel_l1(audio, vocoded, self.cfg), 5),
            "mcd_dtw_db": mcd_or_none(audio, vocoded, sr),
            "griffin_lim_mel_l1": round(host_mel_l1(audio, gl, self.cfg), 5),
            "griffin_lim_mcd_dtw_db": mcd_or_none(audio, gl, sr),
        }

    def _result(self, split, index, rows, skipped, fault_log, t0) -> dict:
        """All processes' rows -> the split's result (frame-weighted mel L1; the compared
        utterances' means)."""
        rows, skipped = eval_splits.gather_rows(self.config, split, index, rows, skipped, fault_log)
        frames = sum(r["frames"] for r in rows)
        mel_l1 = sum(r["mel_l1"] * r["frames"] for r in rows) / max(frames, 1)

        def mean(key: str) -> float | None:
            values = [r[key] for r in rows if r.get(key) is not None]
            return round(float(np.mean(values)), 4) if values else None

        return {
            "split": split,
            "num_utts": len(rows),
            "skipped": skipped,
            "mel_l1": round(mel_l1, 5),
            "compared_utterances": sum("mel_l1_host" in r for r in rows),
            "mel_l1_compared": mean("mel_l1_host"),
            "mcd_dtw_db": mean("mcd_dtw_db"),
            "griffin_lim_mel_l1": mean("griffin_lim_mel_l1"),
            "griffin_lim_mcd_dtw_db": mean("griffin_lim_mcd_dtw_db"),
            "eval_seconds": round(time.time() - t0, 1),
            "utterances": rows,
        }

    # ------------------------------------------------------------------ samples
    def samples(
        self, step: int, params: dict, local: dict, writer: MetricWriter, workdir: str
    ) -> None:
        """A training row's segment vocoded from its log-mel: RUN/samples/step<N>.wav,
        TensorBoard audio "vocoder/sample" and image "vocoder/mel_real_vocoded"."""
        rows = self.rows // jax.process_count()
        width = local["audio"].shape[1]
        batch = vocoder_batch.empty_vocoder_batch(rows, width)
        have = min(rows, local["audio"].shape[0])
        batch["audio"][:have], batch["audio_len"][:have] = (
            local["audio"][:have],
            local["audio_len"][:have] * (local["weight"][:have] > 0),
        )
        with jax.set_mesh(self.mesh):
            arrays = mesh_lib.host_to_global(self.mesh, batch)
            out = self.eval_fn(params["generator"], arrays["audio"], arrays["audio_len"])
            out = {k: mesh_lib.to_host_local(self.mesh, v) for k, v in out.items()}
        n = int(batch["audio_len"][0])
        if jax.process_index() != 0 or n == 0:
            return
        sr, frames = self.cfg.sample_rate, int(out["frames"][0])
        real, wave = out["mel"][0, :frames], out["vocoded"][0, :n]
        fake = reference_log_mel(wave, self.cfg)
        lo, hi = np.percentile(real, 1), np.percentile(real, 99)
        pictures = [images.spectrogram_image(x, lo=lo, hi=hi) for x in (real, fake)]
        writer.image(step, "vocoder/mel_real_vocoded", images.stack_images(pictures))
        writer.audio(step, "vocoder/sample", wave, sr)
        path = os.path.join(workdir, SAMPLES_DIR, f"step{step}.wav")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        sf.write(path, np.clip(wave, -1.0, 1.0), sr, subtype="PCM_16")
        log(
            f"samples at step {step}: a {n / sr:.2f} s training segment vocoded, mel L1 "
            f"{float(out['mel_abs'][0]) / (frames * self.cfg.num_mel_bins):.3f}; audio "
            f"{path}, mel images in TensorBoard"
        )
