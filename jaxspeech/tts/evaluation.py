"""Evaluate a trained synthesizer (a run whose config.task is "tts"):
`python -m jaxspeech.evaluate --workdir TTS_RUN --data DIR --split dev,test
[--asr_workdir ASR_RUN] [--vocoder_workdir VOCODER_RUN] [--max_utterances N]`.

Every utterance of each split is synthesized from its phonemes for its speaker, twice
(`tts_scores`): with the model's own durations (the real use) and with the recording's
phoneme durations (in step with the recording), both vocoded by Griffin-Lim
(`audio.griffin_lim`), and scored against the recording: MCD-DTW, wide-band PESQ, F0 RMSE
and voicing error. With `asr_workdir`, a trained recognizer (`evaluation.recognize`)
transcribes the predicted-duration speech and the recordings themselves: its CER / WER on
both and their ratio, synthesized over real, measure intelligibility, an automatic stand-in
for a listening test's MOS (it says nothing of naturalness). With `vocoder_workdir`, a
trained HiFi-GAN (`vocoder.inference`, a run of config.task "vocoder" on the same front
end) vocodes the same two syntheses too: every measure, the recognizer's included, is
taken for both vocoders, Griffin-Lim's at the top level of rows and summary as before,
HiFi-GAN's beside them under "hifigan", and each kept sample is written for both.

DNSMOS (`metrics.mos`: P.835 SIG / BAK / OVRL and P.808, estimates of a listening test's
MOS that need no reference) scores the predicted-duration speech of each vocoder and the
recordings themselves (under "real") for each split's first `mos_utterances` utterances
(`MOS_UTTERANCES` by default; about 1.4 s of one CPU core per utterance and system, in a
thread of its own beside the rest of the evaluation).

A synthesizer speaks only its training voices and phonemes: an utterance whose speaker or
phonemes are not in the run's tables (RUN/assets) is skipped and counted with its reason,
as are unreadable records and records whose phoneme fields do not fit their audio; a split
prepared without phonemes is refused with one line.

Synthesis runs on the devices in batches of one fixed shape per split (`ROWS` x the
split's most phonemes x twice its longest recording's frames: one compilation per
duration mode); vocoding, PESQ, F0 and the scores run on the host, `CHUNK` records at a
time. Results, as the recognizer's evaluation writes them: RUN/eval/<split>-step<N>
-synthesis.json (the summary, also printed as one JSON line) and
-synthesis-utts.jsonl (one line per scored utterance); the first `SAMPLES` utterances of
each split as RUN/eval/samples/<split>-step<N>-<id>.wav and in TensorBoard (RUN/tensorboard:
audio, mel spectrograms of the recording and both syntheses, and the split's means).
One process.
"""

from __future__ import annotations

import dataclasses
import io
import os
import time
from concurrent.futures import Future, ThreadPoolExecutor

import jax
import numpy as np
import soundfile as sf

from jaxspeech.audio import features
from jaxspeech.audio.griffin_lim import griffin_lim
from jaxspeech.common import files, storage
from jaxspeech.common.errors import UserError
from jaxspeech.config import build
from jaxspeech.data import reader as reader_lib
from jaxspeech.data import records
from jaxspeech.evaluation import scoring
from jaxspeech.evaluation.recognize import WaveRecognizer
from jaxspeech.evaluation.splits import parse_splits
from jaxspeech.metrics import images
from jaxspeech.metrics.mos import Dnsmos
from jaxspeech.metrics.speech import Reference
from jaxspeech.metrics.wer import ErrorCounts
from jaxspeech.metrics.writers import MetricWriter
from jaxspeech.parallel import mesh as mesh_lib
from jaxspeech.parallel import rules
from jaxspeech.runs import checkpoint as ckpt_lib
from jaxspeech.runs import loading, remote
from jaxspeech.tts import assets as tts_assets
from jaxspeech.tts import batch as tts_batch
from jaxspeech.tts import scores as tts_scores
from jaxspeech.tts.loading import TtsRun, denormalized, load_tts_run
from jaxspeech.tts.model import make_synthesize_fn
from jaxspeech.vocoder.inference import NAME as NEURAL
from jaxspeech.vocoder.inference import NeuralVocoder, VocoderRun, load_checked_vocoder

TAG = "-synthesis"  # RUN/eval/<split>-step<N>-synthesis.json: beside the in-loop results
SAMPLES_DIR = "samples"  # RUN/eval/samples/
SAMPLES = 4  # utterances per split kept as WAV files and in TensorBoard
ROWS = 8  # utterances synthesized at once (rounded up to a multiple of the batch shards)
CHUNK = 64  # records read, synthesized and scored at a time (bounds the host memory)
# Utterances per split scored by DNSMOS. Each costs about 1.4 s of one CPU core for the
# recording and for each vocoder (a 2-4 s utterance is repeated to 9-16 s: 2-7 windows),
# so 32 are about 2 minutes of one core in `make demo-tts` (recordings, Griffin-Lim, the
# Vocos), scored beside the rest; every system is scored on the same 32 sentences.
MOS_UTTERANCES = 32
# The summary's values that go to TensorBoard (RUN/tensorboard, as synthesis/<split>/<key>).
SCALARS = (*tts_scores.MEASURES, "cer_synthesized", "cer_real", "wer_synthesized", "wer_real")
INTELLIGIBILITY_NOTE = (
    "recognizer CER is an automatic stand-in for MOS: it measures intelligibility to "
    "this recognizer (synthesized vs. real speech), not naturalness"
)


# ---------------------------------------------------------------- the split's utterances
@dataclasses.dataclass
class Utterance:
    """One record the synthesizer can speak."""

    id: str
    speaker: str
    text: str
    audio: np.ndarray  # (S,) float32 in [-1, 1]
    tokens: np.ndarray  # (K,) int32 phoneme ids of the run's table
    durations: np.ndarray  # (K,) int32 frames of the recording per phoneme
    speaker_id: int


def _problem(rec: dict, assets: tts_assets.TtsAssets) -> tuple[str, str] | None:
    """(reason, detail) why the run cannot synthesize this record, or None."""
    if rec["speaker"] not in assets.speakers:
        return "unknown speaker", f"speaker {rec['speaker']!r} is not in the run's table"
    problem = tts_batch.phoneme_problem(rec)
    if problem is not None:
        return "bad phoneme fields", problem
    known = set(assets.table.tokens)
    unknown = sorted({p for p in rec["phonemes"].split(" ") if p not in known})
    if unknown:
        return "unknown phoneme", f"phonemes {unknown[:5]} are not in the run's table"
    return None


def check_split(data_dir: str, split: str, sample_rate: int) -> records.SplitIndex:
    """The split's index, once it is known to carry phonemes at the run's sample rate.

    Raises:
      UserError: not prepared, prepared without phonemes, or at another sample rate.
    """
    local = storage.local_data(data_dir, split)
    try:
        index = records.read_split_index(local, split)
    except FileNotFoundError as e:
        raise UserError(str(e)) from e
    tts_assets.read_inventory(local, split)  # one line for a split without phonemes
    if index.sample_rate != sample_rate:
        raise UserError(
            f"{data_dir}/{split} is at {index.sample_rate} Hz but the run was trained at "
            f"{sample_rate} Hz (config.features.sample_rate): prepare the split at that rate"
        )
    return index


def read_utterances(
    index: records.SplitIndex, positions: range, assets: tts_assets.TtsAssets, hop: int
) -> tuple[list[Utterance], list[dict]]:
    """The records at `positions` of the split: those the run can synthesize, and the
    others as {"id", "reason", "detail"} (`_problem`, or "unreadable")."""
    reader = reader_lib.RecordReader(index.shard_paths, index.shard_num_records)
    raw, _, _ = reader.read(list(positions))
    utts, skipped = [], []
    for pos, data in zip(positions, raw):
        rec, why = None, "the record cannot be read"
        if data is not None:
            try:
                rec = records.decode_record(data)
            except ValueError as e:  # corrupt bytes
                why = str(e)
        if rec is None:
            skipped.append({"id": f"record {pos}", "reason": "unreadable", "detail": why})
            continue
        problem = _problem(rec, assets)
        if problem is not None:
            skipped.append({"id": rec["id"], "reason": problem[0], "detail": problem[1]})
            continue
        audio = reader_lib.audio_float32(rec)
        sr = rec["sample_rate"]
        phonemes = rec["phonemes"].split(" ")
        utts.append(
            Utterance(
                id=rec["id"],
                speaker=rec["speaker"],
                text=rec["text"],
                audio=audio,
                tokens=assets.table.encode(phonemes),
                durations=tts_batch.frame_durations(rec["phoneme_ends"], len(audio), sr, hop),
                speaker_id=assets.speakers[rec["speaker"]],
            )
        )
    return utts, skipped


def split_shape(index: records.SplitIndex, count: int, hop: int) -> tuple[int, int]:
    """(phonemes, frames) of the synthesis batches of the split's first `count` records:
    its most phonemes (a pass over the records' headers; rounded up to a multiple of 8)
    and twice its longest recording's frames (room for slow predicted durations; speech
    that runs past them is cut there and marked "truncated"; a multiple of 64)."""
    reader = reader_lib.RecordReader(index.shard_paths, index.shard_num_records)
    most = 1
    for start in range(0, count, CHUNK):
        raw, _, _ = reader.read(list(range(start, min(start + CHUNK, count))))
        for data in raw:
            try:
                header = records.decode_header(data) if data is not None else {}
            except ValueError:
                continue  # unreadable: skipped and counted when read in full
            most = max(most, len(str(header.get("phonemes", "")).split(" ")))
    longest = float(index.durations[:count].max()) if count else 0.0
    frames = int(features.num_frames(int(np.ceil(longest * index.sample_rate)), hop))
    return 8 * -(-most // 8), 64 * -(-2 * frames // 64)


# ---------------------------------------------------------------- synthesis
class Synthesizer:
    """The run's model at one batch shape (`rows` x `tokens_n` phonemes, `frames_n`
    frames): utterances -> their raw log-mel frames synthesized with the predicted and
    with the recording's durations."""

    def __init__(self, run: TtsRun, tokens_n: int, frames_n: int):
        self.run, self.tokens_n, self.frames_n = run, tokens_n, frames_n
        self.rules = build.rules_from_config(run.config)
        with rules.axis_rules(self.rules):
            self.rows = mesh_lib.unit_rows(run.spec.mesh, ROWS)
        self.fn = make_synthesize_fn(run.spec.graphdef, frames_n)

    def __call__(self, utts: list[Utterance]) -> list[tuple[np.ndarray, np.ndarray, bool]]:
        """[(predicted (T1, M), aligned (T, M) raw log-mel, whether the predicted speech
        was cut at frames_n)] per utterance; T is the recording's frame count."""
        run, mesh = self.run, self.run.spec.mesh
        out = []
        for start in range(0, len(utts), self.rows):
            part = utts[start : start + self.rows]
            host = {
                "tokens": np.zeros((self.rows, self.tokens_n), np.int32),
                "durations": np.zeros((self.rows, self.tokens_n), np.int32),
                "speaker": np.zeros((self.rows,), np.int32),
            }  # padding rows: no phoneme, no frame
            for i, u in enumerate(part):
                host["tokens"][i, : len(u.tokens)] = u.tokens
                host["durations"][i, : len(u.durations)] = u.durations
                host["speaker"][i] = u.speaker_id
            with rules.axis_rules(self.rules), jax.set_mesh(mesh):
                x = mesh_lib.host_to_global(mesh, host)
                both = [
                    self.fn(run.params, x["tokens"], x["speaker"]),
                    self.fn(run.params, x["tokens"], x["speaker"], x["durations"]),
                ]
                (p_mel, p_n), (a_mel, a_n) = [
                    (mesh_lib.to_host_local(mesh, m), mesh_lib.to_host_local(mesh, n))
                    for m, n in both
                ]
            for i in range(len(part)):
                n, m = int(p_n[i]), int(a_n[i])
                predicted = denormalized(p_mel[i, :n], run.model_vars)
                aligned = denormalized(a_mel[i, :m], run.model_vars)
                out.append((predicted, aligned, n >= self.frames_n))
        return out


# ---------------------------------------------------------------- one split
class SplitEvaluation:
    """One split of one run: its utterances synthesized, vocoded and scored `CHUNK` at a
    time; the first `SAMPLES` kept (`_keep_sample`); `result()` at the end."""

    def __init__(
        self,
        run: TtsRun,
        split: str,
        index: records.SplitIndex,
        count: int,
        recognizer: WaveRecognizer | None,
        writer: MetricWriter,
        out_dir: str,
        vocoder_run: VocoderRun | None = None,
        mos: Dnsmos | None = None,
        mos_utterances: int = MOS_UTTERANCES,
    ):
        self.run, self.split, self.index, self.count = run, split, index, count
        self.mos, self.mos_utterances = mos, mos_utterances  # DNSMOS of the first N
        self.recognizer, self.writer, self.out_dir = recognizer, writer, out_dir
        self.cfg = build.feature_config(run.config)
        self.synthesize = Synthesizer(run, *split_shape(index, count, self.cfg.hop_length))
        self.neural = None  # HiFi-GAN at the synthesis batches' frames: one compilation
        if vocoder_run is not None:
            self.neural = NeuralVocoder(vocoder_run, self.synthesize.frames_n)
        self.rows: list[dict] = []
        self.skipped: list[dict] = []
        # DNSMOS jobs in flight: (the row, where its scores go: None for the row itself,
        # "real" or NEURAL, the job); `run_all` collects them.
        self.mos_jobs: list[tuple[dict, str | None, Future]] = []
        self.mos_pool: ThreadPoolExecutor | None = None
        self.counts = {"synthesized": ErrorCounts(), "real": ErrorCounts()}
        if self.neural is not None:
            self.counts[NEURAL] = ErrorCounts()  # HiFi-GAN's synthesized speech

    def run_all(self) -> dict:
        """Every record of the split's first `count`, `CHUNK` at a time -> `result`."""
        t0 = time.time()
        # DNSMOS scores in a thread of its own: onnxruntime lets go of the GIL, so its
        # networks run while this thread vocodes and analyses the next utterances (numpy,
        # librosa's pYIN: one core). On the 2-core VM that hid most of its ~1 s an utterance
        # and system behind the rest of `make demo-tts`'s evaluation.
        self.mos_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="dnsmos")
        try:
            for start in range(0, self.count, CHUNK):
                positions = range(start, min(start + CHUNK, self.count))
                utts, skipped = read_utterances(
                    self.index, positions, self.run.assets, self.cfg.hop_length
                )
                self.skipped += skipped
                self._chunk(utts)
            self._collect_mos()
        finally:  # an error: the jobs not started are dropped, not waited for
            self.mos_pool.shutdown(wait=False, cancel_futures=True)
        return self.result(time.time() - t0)

    def _score_mos(self, row: dict, where: str | None, wave: np.ndarray) -> None:
        """DNSMOS of (S,) `wave` queued for `row` (`where`: None, "real" or NEURAL)."""
        job = self.mos_pool.submit(tts_scores.dnsmos_scores, self.mos, wave, self.cfg.sample_rate)
        self.mos_jobs.append((row, where, job))

    def _collect_mos(self) -> None:
        """The queued DNSMOS scores, waited for and written into their rows."""
        for row, where, job in self.mos_jobs:
            if where == "real":  # the recordings' own, the level the synthesizers aim at
                row["real"] = job.result()
            else:
                tts_scores.add_dnsmos(row if where is None else row[where], job.result())
        self.mos_jobs = []

    def _chunk(self, utts: list[Utterance]) -> None:
        """Synthesize, vocode (Griffin-Lim, and HiFi-GAN when given) and score `utts`;
        rows appended to `self.rows`."""
        sr, cfg = self.cfg.sample_rate, self.cfg
        predicted_waves, neural_waves = [], []
        synthesized = self.synthesize(utts)
        neural = self._neural(synthesized)
        for i, (u, (p_mel, a_mel, truncated)) in enumerate(zip(utts, synthesized)):
            predicted = griffin_lim(p_mel, cfg)
            aligned = griffin_lim(a_mel, cfg)[: len(u.audio)]  # T * hop >= S samples
            row = {
                "id": u.id,
                "speaker": u.speaker,
                "text": u.text,
                "phonemes": len(u.tokens),
                "seconds": round(len(u.audio) / sr, 3),
                "synthesized_seconds": round(len(predicted) / sr, 3),
                "truncated": truncated,
            }
            mos = self.mos is not None and len(self.rows) < self.mos_utterances
            ref = Reference(u.audio, sr)  # the recording analysed once for every vocoder
            row |= tts_scores.score_utterance(ref, predicted, aligned, sr)
            if mos:
                self._score_mos(row, None, predicted)
                self._score_mos(row, "real", u.audio)
            if neural:
                n_predicted, n_aligned = neural[i]
                neural_waves.append(n_predicted)
                row[NEURAL] = tts_scores.score_utterance(
                    ref, n_predicted, n_aligned[: len(u.audio)], sr
                )
                if mos:
                    self._score_mos(row, NEURAL, n_predicted)
            self.rows.append(row)
            predicted_waves.append(predicted)
            if len(self.rows) <= SAMPLES:
                self._keep_sample(u, predicted, p_mel, a_mel, neural[i][0] if neural else None)
        if self.recognizer is not None and utts:
            rows = self.rows[len(self.rows) - len(utts) :]
            self._recognize(utts, predicted_waves, rows, neural_waves)

    def _neural(self, synthesized: list) -> list[tuple[np.ndarray, np.ndarray]]:
        """HiFi-GAN's (predicted, aligned) waveforms of `synthesized` ([] without it)."""
        if self.neural is None or not synthesized:
            return []
        predicted = self.neural([p for p, _, _ in synthesized])
        aligned = self.neural([a for _, a, _ in synthesized])
        return list(zip(predicted, aligned))

    def _recognize(
        self,
        utts: list[Utterance],
        predicted: list[np.ndarray],
        rows: list[dict],
        neural: list[np.ndarray],
    ):
        """The recognizer's hypotheses and error rates on the synthesized (by each
        vocoder) and the real speech of `utts`, added to their `rows` (HiFi-GAN's under
        row["hifigan"], as "synthesized") and to the split's counts."""
        sr, asr = self.cfg.sample_rate, self.recognizer
        # The longest synthesis possible: one width for every batch of the split.
        seconds = self.synthesize.frames_n * self.cfg.hop_length / sr
        hyps = {
            "synthesized": asr.transcribe(predicted, sr, seconds),
            "real": asr.transcribe([u.audio for u in utts], sr, seconds),
        }
        if neural:
            hyps[NEURAL] = asr.transcribe(neural, sr, seconds)
        for i, (u, row) in enumerate(zip(utts, rows)):
            row["ref"] = asr.normalize(u.text)
            for kind, counts in self.counts.items():
                c = asr.score(counts, u.text, hyps[kind][i])
                where, name = (row[NEURAL], "synthesized") if kind == NEURAL else (row, kind)
                where[f"hyp_{name}"] = hyps[kind][i]
                where[f"cer_{name}"] = round(c["char_errors"] / max(c["chars"], 1), 4)
                where[f"wer_{name}"] = round(c["word_errors"] / max(c["words"], 1), 4)

    def _keep_sample(self, u: Utterance, predicted: np.ndarray, p_mel, a_mel, neural) -> None:
        """The predicted-duration speech as RUN/eval/samples/<split>-step<N>-<id>.wav
        (HiFi-GAN's, when given, as ...-<id>-hifigan.wav) and TensorBoard audio; the
        recording's, the aligned and the predicted mel as one image (top to bottom)."""
        step, sr = self.run.step, self.cfg.sample_rate
        stem = f"{self.split}-step{step}-{u.id.replace('/', '_')}"
        tag = f"synthesis/{self.split}/{u.id}"
        waves = [("", predicted)] + ([(f"-{NEURAL}", neural)] if neural is not None else [])
        for suffix, wave in waves:
            path = os.path.join(self.out_dir, SAMPLES_DIR, f"{stem}{suffix}.wav")
            os.makedirs(os.path.dirname(path), exist_ok=True)
            buf = io.BytesIO()
            sf.write(buf, np.clip(wave, -1.0, 1.0), sr, format="WAV", subtype="PCM_16")
            files.atomic_write(path, buf.getvalue())
            self.writer.audio(step, tag + suffix.replace("-", "/"), wave, sr)
        ref = features.reference_log_mel(u.audio, self.cfg)
        lo, hi = np.percentile(ref, 1), np.percentile(ref, 99)  # one scale for the three
        pictures = [images.spectrogram_image(x, lo=lo, hi=hi) for x in (ref, a_mel, p_mel)]
        self.writer.image(step, f"{tag}/mel_real_aligned_predicted", images.stack_images(pictures))

    def result(self, seconds: float) -> dict:
        """The split's summary (means, counts, skip reasons, the recognizer's rates and
        their ratio) with its rows under "utterances"; its means go to TensorBoard."""
        reasons: dict[str, int] = {}
        for s in self.skipped:
            reasons[s["reason"]] = reasons.get(s["reason"], 0) + 1
        out = {
            "split": self.split,
            "task": "tts",
            "num_utts": len(self.rows),
            "skipped": len(self.skipped),
            "skipped_reasons": reasons,
            "skipped_examples": self.skipped[:5],
            **tts_scores.summarize(self.rows),
            "truncated": sum(r["truncated"] for r in self.rows),
            "vocoder": "griffin_lim",  # the top level's; HiFi-GAN's under "hifigan"
        }
        if self.recognizer is not None:
            out |= self._intelligibility()
        if self.neural is not None:
            out[NEURAL] = self._neural_summary(out)
        real = [r["real"] for r in self.rows if "real" in r]
        if real:  # DNSMOS of the recordings
            out["real"] = tts_scores.summarize(real, tts_scores.DNSMOS)
        scalars = {f"synthesis/{self.split}/{k}": v for k, v in out.items() if k in SCALARS}
        for name in (NEURAL, "real"):
            for k, v in out.get(name, {}).items():
                scalars[f"synthesis/{self.split}/{name}/{k}"] = v if k in SCALARS else None
        self.writer.scalars(self.run.step, {k: v for k, v in scalars.items() if v is not None})
        examples = []  # the console's ref / hyp lines, as the recognizer's evaluation prints
        if self.recognizer is not None:
            examples = [{"ref": r["ref"], "hyp": r["hyp_synthesized"]} for r in self.rows[:3]]
        return out | {
            "eval_seconds": round(seconds, 1),
            "examples": examples,
            "utterances": sorted(self.rows, key=lambda r: r["id"]),  # as the recognizer's
        }

    def _neural_summary(self, out: dict) -> dict:
        """HiFi-GAN's summary: its measures' means and, with a recognizer, its CER / WER
        on the synthesized speech and their ratios to the real speech's (in `out`)."""
        run = self.neural.run
        summary = tts_scores.summarize([r[NEURAL] for r in self.rows])
        summary |= {"vocoder_workdir": run.workdir, "vocoder_step": run.step}
        summary["generator"] = self.neural.kind  # "hifigan" or "vocos"
        if self.recognizer is not None:
            for unit in ("cer", "wer"):
                rate = getattr(self.counts[NEURAL], unit)
                summary[f"{unit}_synthesized"] = round(rate, 5)
                real = out[f"{unit}_real"]
                summary[f"{unit}_ratio"] = round(rate / real, 4) if real > 0 else None
        return summary

    def _intelligibility(self) -> dict:
        """The recognizer's CER / WER on the synthesized and the real speech, and the
        ratios synthesized / real (None where the real speech's rate is 0)."""
        asr = self.recognizer
        out: dict = {"asr_workdir": asr.workdir, "asr_step": asr.run.step}
        for unit in ("cer", "wer"):
            rates = {k: getattr(self.counts[k], unit) for k in ("synthesized", "real")}
            out[f"{unit}_synthesized"] = round(rates["synthesized"], 5)
            out[f"{unit}_real"] = round(rates["real"], 5)
            ratio = rates["synthesized"] / rates["real"] if rates["real"] > 0 else None
            out[f"{unit}_ratio"] = None if ratio is None else round(ratio, 4)
        return out | {"intelligibility_note": INTELLIGIBILITY_NOTE}


# ---------------------------------------------------------------- the job
def evaluate_tts_splits(
    workdir: str,
    data_dir: str | None,
    splits: list[str] | None,
    step: int | None,
    *,
    asr_workdir: str | None = None,
    method: str | None = None,
    beam: int | None = None,
    decoding: dict | None = None,
    max_utterances: int | None = None,
    vocoder_workdir: str | None = None,
    mos_utterances: int | None = None,
) -> list[dict]:
    """Restore the synthesizer RUN's checkpoint (latest unless `step`) and evaluate each
    split (default: the run's data.eval_split list) as the module docstring says, writing
    RUN/eval/ for each; `asr_workdir`: the recognizer whose CER / WER measure
    intelligibility, decoded with `method`, `beam` and `decoding` overriding its config
    (`evaluation.run.run_eval_config`). `max_utterances`: the first N records of each split.
    `vocoder_workdir`: a trained HiFi-GAN on the same front end, scored beside Griffin-Lim.
    `mos_utterances`: DNSMOS on each split's first N (default `MOS_UTTERANCES`; 0: none).

    Raises:
      UserError: not a run directory, no such checkpoint, a split not prepared or prepared
        without phonemes, a recognizer run that cannot be loaded, a vocoder run of another
        front end, more than one process.
    """
    if jax.process_count() > 1:
        raise UserError("evaluating a synthesizer runs in one process")
    if max_utterances is not None and max_utterances < 1:
        raise UserError(f"--max_utterances must be >= 1, got {max_utterances}")
    mos_n = MOS_UTTERANCES if mos_utterances is None else mos_utterances
    if mos_n < 0:
        raise UserError(f"--mos_utterances must be >= 0, got {mos_n}")
    try:
        config = loading.load_run_config(workdir)
        splits = splits or parse_splits(config.data.eval_split)
        data_dir = data_dir or config.data.dir
        rate = int(config.features.sample_rate)
        # Every split is checked before anything is loaded or compiled.
        indexes = {s: check_split(data_dir, s, rate) for s in splits}
        vocoder_run = None
        if vocoder_workdir:  # its front end is checked before any checkpoint is read
            features_cfg = build.feature_config(config)
            vocoder_run = load_checked_vocoder(vocoder_workdir, features_cfg, workdir)
        with rules.axis_rules(build.rules_from_config(config)):
            run = load_tts_run(workdir, step=step, config=config)
        # Its two networks, loaded once; its runs' threads leave one core to the
        # evaluation's own thread, which works beside them (`SplitEvaluation.run_all`).
        mos = Dnsmos(threads=max(1, min((os.cpu_count() or 2) - 1, 4))) if mos_n else None
    except (FileNotFoundError, ValueError, ckpt_lib.CheckpointError) as e:
        raise UserError(str(e)) from e
    recognizer = None
    if asr_workdir:
        try:
            recognizer = WaveRecognizer.from_workdir(asr_workdir, method, beam, decoding)
        except (FileNotFoundError, ValueError, ckpt_lib.CheckpointError) as e:
            raise UserError(f"--asr_workdir: {e}") from e
    copy = remote.reader(workdir)  # a run on an object store: written here, then pushed
    out_dir = os.path.join(copy.local, "eval")
    writer = MetricWriter(os.path.join(copy.local, "tensorboard"))
    results = []
    try:
        for split in splits:
            index = indexes[split]
            count = min(max_utterances or index.num_records, index.num_records)
            evaluation = SplitEvaluation(
                run, split, index, count, recognizer, writer, out_dir, vocoder_run, mos, mos_n
            )
            result = evaluation.run_all() | {"step": run.step}
            scoring.write_result(copy.local, result, run.step, TAG)
            results.append(result)
    finally:
        writer.close()
    copy.push()
    return results
