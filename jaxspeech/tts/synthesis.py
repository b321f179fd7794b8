"""Text -> WAV files with a trained synthesizer: what `python -m jaxspeech.synthesize`
runs (`synthesize_to_files`).

A run directory (its checkpoint, loaded on one device) or an exported artifact directory
(`jaxspeech.export` of a synthesizer's run: its `acoustic` function, StableHLO or ONNX)
gives the same function (`tts.acoustic`), phoneme and speaker tables, front end and
max_frames. Each sentence is phonemized (`tts.frontend`), checked on the host, spoken
`ROWS` at a time, vocoded by Griffin-Lim (`audio.griffin_lim`) or a neural vocoder (a
vocoder run, `vocoder.inference`, or the artifact's own `vocoder` function) and written
as a 16-bit WAV at the run's sample rate.

Every input mistake is one line (`UserError`) before anything is written: an unknown
speaker, empty text, a character or phoneme the front end cannot give, a duration scale
that is not a number > 0, a sentence with more phonemes than max_frames, or one whose
predicted speech would run past max_frames (the model's frame axis; `tts.artifact`'s
`default_max_frames`: twice the longest training utterance). Blank lines of a text file
are skipped and counted.

Many sentences (a text file) -> DIR/0001.wav, ... (numbered by line) and
DIR/manifest.jsonl, one JSON line per file: {"audio_filepath", "line", "text" (the
transcript), "input", "phonemes", "speaker", "duration"} (a manifest
`data_prep.prepare --format manifest` reads).
"""

from __future__ import annotations

import dataclasses
import io
import json
import math
import os
from collections.abc import Callable
from typing import TextIO

import jax
import numpy as np
import soundfile as sf

from jaxspeech.audio.features import LogMelConfig
from jaxspeech.audio.griffin_lim import griffin_lim
from jaxspeech.common import files
from jaxspeech.common.errors import UserError
from jaxspeech.config import build
from jaxspeech.serving.progress import FileProgress
from jaxspeech.tts import acoustic as tts_acoustic
from jaxspeech.tts import artifact as tts_artifact
from jaxspeech.tts import frontend
from jaxspeech.tts.batch import PhonemeTable
from jaxspeech.tts.model import id_mistake
from jaxspeech.vocoder import inference as vocoder_inference

ROWS = 8  # sentences spoken at once
TOKEN_ROUND = 16  # phoneme axis rounded up to a multiple of it: few compilations
MANIFEST = "manifest.jsonl"
PROGRESS_FROM = 10  # sentences: a progress line on the stream from this many


# ---------------------------------------------------------------- the synthesizer
@dataclasses.dataclass
class Synthesizer:
    """What a run or an artifact gives: `acoustic(phonemes (b, n), phoneme_len (b,),
    speaker (b,), duration_scale (b,))` -> numpy (log_mel (b, T, M), frame_mask (b, T),
    durations (b, n), truncated (b,)), T = max_frames; its tables and front end; and a
    neural `vocoder` ([(T_i, M) log-mel] -> [(T_i * hop,) audio]) when it has one."""

    acoustic: Callable
    table: PhonemeTable
    speakers: dict[str, int]  # name -> id
    features: LogMelConfig
    max_frames: int
    source: str  # the run or artifact directory, for messages
    vocoder: Callable | None = None
    vocoder_name: str = "griffin_lim"


def from_run(workdir: str, step: int | None = None) -> Synthesizer:
    """A synthesizer RUN's checkpoint (latest unless `step`) on one device, running the
    exported function itself (jit) at the export's default max_frames.

    Raises:
      UserError: not a synthesizer's run, no such checkpoint.
    """
    run = tts_artifact.load_run(workdir, step)
    frames = tts_artifact.default_max_frames(run.config)
    fn = tts_acoustic.acoustic_function(
        run.spec.graphdef,
        jax.device_get(run.params),
        jax.device_get(run.model_vars),
        frames,
        float(run.config.features.log_floor),
    )
    jitted = jax.jit(fn)
    acoustic = lambda *args: tuple(np.asarray(x) for x in jitted(*args))  # noqa: E731
    features = build.feature_config(run.config)
    return Synthesizer(acoustic, run.assets.table, run.assets.speakers, features, frames, workdir)


def with_vocoder_run(synth: Synthesizer, vocoder_workdir: str) -> Synthesizer:
    """`synth` vocoded by a vocoder run's latest checkpoint (`vocoder.inference`).

    Raises:
      UserError: not a vocoder's run, or one trained on another front end.
    """
    run = vocoder_inference.load_checked_vocoder(vocoder_workdir, synth.features, synth.source)
    neural = vocoder_inference.NeuralVocoder(run, synth.max_frames)
    return dataclasses.replace(synth, vocoder=neural, vocoder_name=neural.kind)


def _artifact_function(directory: str, entry: dict) -> Callable:
    """One exported function of an artifact as numpy arrays -> tuple of numpy arrays."""
    path = files.inside(directory, entry["file"], os.path.join(directory, "manifest.json"))
    if path.endswith(".onnx"):
        import onnxruntime as ort  # noqa: PLC0415 (only for an ONNX artifact)

        session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
        names = [i.name for i in session.get_inputs()]
        return lambda *args: tuple(session.run(None, dict(zip(names, args))))
    with open(path, "rb") as f:
        call = jax.jit(jax.export.deserialize(bytearray(f.read())).call)
    return lambda *args: tuple(np.asarray(x) for x in call(*args))


def from_artifact(directory: str) -> Synthesizer:
    """An exported synthesizer (`tts.artifact`): its acoustic function and, when it was
    exported with a vocoder, its vocoder function.

    Raises:
      UserError: no artifact there, or not a synthesizer's of this format version.
    """
    path = os.path.join(directory, "manifest.json")
    try:
        with open(path, encoding="utf-8") as f:
            manifest = json.load(f)
    except (OSError, ValueError) as e:
        raise UserError(
            f"--artifact: {path} cannot be read ({e}): export one with "
            "`python -m jaxspeech.export --workdir TTS_RUN --output DIR`"
        ) from e
    if manifest.get("task") != "tts" or manifest.get("format_version") != 1:
        raise UserError(
            f"--artifact: {directory} is not a synthesizer's export of format version 1 "
            f"(task {manifest.get('task')!r}, format_version {manifest.get('format_version')!r})"
        )
    fields = {f.name for f in dataclasses.fields(LogMelConfig)}
    features = LogMelConfig(**{k: v for k, v in manifest["features"].items() if k in fields})
    functions = manifest["functions"]
    acoustic = _artifact_function(directory, functions[tts_acoustic.NAME])
    speakers = {name: i for i, name in enumerate(manifest["speakers"]["table"])}
    synth = Synthesizer(
        acoustic,
        PhonemeTable(tuple(manifest["phonemes"]["table"])),
        speakers,
        features,
        int(manifest["max_frames"]),
        directory,
    )
    if manifest.get("vocoder"):
        generator = _artifact_function(directory, functions[manifest["vocoder"]["function"]])
        vocoder = ArtifactVocoder(generator, synth.max_frames, features)
        synth = dataclasses.replace(
            synth, vocoder=vocoder, vocoder_name=manifest["vocoder"].get("kind", "neural")
        )
    return synth


class ArtifactVocoder:
    """An artifact's `vocoder` function ((b, t, M) log-mel, (b, t) mask -> (b, t * hop)
    audio, sample mask), `ROWS` utterances at a time at `frames` frames."""

    def __init__(self, fn: Callable, frames: int, cfg: LogMelConfig):
        self.fn, self.frames, self.cfg = fn, frames, cfg

    def __call__(self, mels: list[np.ndarray]) -> list[np.ndarray]:
        out = []
        for start in range(0, len(mels), ROWS):
            part = mels[start : start + ROWS]
            mel = np.full((len(part), self.frames, self.cfg.num_mel_bins), 0, np.float32)
            mask = np.zeros((len(part), self.frames), bool)
            for i, m in enumerate(part):
                mel[i, : len(m)], mask[i, : len(m)] = m, True
            audio = self.fn(mel, mask)[0]
            out += [
                np.asarray(audio[i, : len(m) * self.cfg.hop_length]) for i, m in enumerate(part)
            ]
        return out


# ---------------------------------------------------------------- sentences
@dataclasses.dataclass
class Sentence:
    """One sentence to speak: its line (1-based), the input, its transcript and
    phoneme tokens."""

    line: int
    input: str
    text: str
    tokens: list[str]


def read_lines(text: str | None, text_file: str | None) -> tuple[list[tuple[int, str]], int]:
    """([(line number, line)] of the non-blank lines, blank lines skipped): `text` is one
    line (its line breaks are spaces), `text_file` one sentence per line.

    Raises:
      UserError: both or neither given, an unreadable file, nothing but blank lines.
    """
    if (text is None) == (text_file is None):
        raise UserError("give the text: --text SENTENCE or --text_file FILE (one of them)")
    if text is not None:
        if not text.strip():
            raise UserError("empty text: nothing to say (--text is blank)")
        return [(1, " ".join(text.split()))], 0
    try:
        with open(text_file, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"--text_file {text_file}: {e}") from e
    kept = [(i, line.strip()) for i, line in enumerate(lines, 1) if line.strip()]
    if not kept:
        raise UserError(f"empty text: --text_file {text_file} has no sentence (blank lines only)")
    return kept, len(lines) - len(kept)


def phonemized(
    lines: list[tuple[int, str]], table: PhonemeTable, front_end: str, voice: frontend.Voice
) -> list[Sentence]:
    """Each line through the front end (`tts.frontend.tokens_of`).

    Raises:
      UserError: the first line the front end cannot phonemize, with its number.
    """
    out = []
    for number, line in lines:
        try:
            text, tokens = frontend.tokens_of(line, table, front_end, voice)
        except UserError as e:
            where = f"line {number}: " if len(lines) > 1 else ""
            raise UserError(f"{where}{e}") from e
        out.append(Sentence(number, line, text, tokens))
    return out


def speaker_id(speaker: str, speakers: dict[str, int]) -> int:
    """The id of `speaker`: a name of the run's speaker table, or an id (its row).

    Raises:
      UserError: neither.
    """
    if speaker in speakers:
        return speakers[speaker]
    if speaker.strip().lstrip("-").isdigit():
        sid = int(speaker)
        if 0 <= sid < len(speakers):
            return sid
    names = sorted(speakers, key=speakers.get)
    shown = ", ".join(names[:8]) + (f", ... ({len(names)} in all)" if len(names) > 8 else "")
    raise UserError(
        f"unknown speaker {speaker!r}: give a name of the run's speaker table ({shown}) "
        f"or an id from 0 to {len(names) - 1}"
    )


# ---------------------------------------------------------------- speaking
def _batches(n: int) -> list[range]:
    return [range(s, min(s + ROWS, n)) for s in range(0, n, ROWS)]


def spoken_mels(
    synth: Synthesizer, sentences: list[Sentence], speaker: int, duration_scale: float
) -> list[np.ndarray]:
    """(T_i, M) raw log-mel of each sentence, every one checked first.

    Raises:
      UserError: a phoneme or speaker id out of range; a sentence with more phonemes
        than max_frames, or whose predicted speech runs past it (all of them named).
    """
    ids = [synth.table.encode(s.tokens) for s in sentences]
    for s, row in zip(sentences, ids):
        mistake = id_mistake(row[None], np.array([speaker]), synth.table.size, len(synth.speakers))
        if mistake:
            raise UserError(mistake)
        if len(row) > synth.max_frames:
            raise UserError(
                f"line {s.line}: {len(row)} phonemes need at least {len(row)} frames, more "
                f"than the model's max_frames ({synth.max_frames}): split the sentence"
            )
    mels, too_long = [], []
    for part in _batches(len(ids)):
        n = TOKEN_ROUND * -(-max(len(ids[i]) for i in part) // TOKEN_ROUND)
        phonemes = np.zeros((len(part), n), np.int32)
        for row, i in enumerate(part):
            phonemes[row, : len(ids[i])] = ids[i]
        lengths = np.array([len(ids[i]) for i in part], np.int32)
        log_mel, mask, durations, truncated = synth.acoustic(
            phonemes,
            lengths,
            np.full((len(part),), speaker, np.int32),
            np.full((len(part),), duration_scale, np.float32),
        )
        for row, i in enumerate(part):
            if truncated[row]:
                too_long.append((sentences[i].line, int(durations[row].sum())))
            mels.append(np.asarray(log_mel[row, : int(mask[row].sum())]))
    if too_long:
        hop_s = synth.features.hop_length / synth.features.sample_rate
        named = ", ".join(f"line {n} ({f * hop_s:.1f} s)" for n, f in too_long[:5])
        raise UserError(
            f"{len(too_long)} sentence(s) would run past the model's max_frames "
            f"({synth.max_frames} frames, {synth.max_frames * hop_s:.1f} s): {named}; "
            "split them into shorter sentences (or lower --duration_scale)"
        )
    return mels


def wav_bytes(audio: np.ndarray, sample_rate: int) -> bytes:
    """16-bit PCM WAV of float samples (clipped to [-1, 1], as a WAV file holds them)."""
    buf = io.BytesIO()
    sf.write(buf, np.clip(audio, -1.0, 1.0), sample_rate, format="WAV", subtype="PCM_16")
    return buf.getvalue()


def output_paths(output: str, sentences: list[Sentence]) -> list[str]:
    """One WAV path per sentence: `output` itself for one sentence and a .wav `output`,
    else OUTPUT/<line>.wav (4 digits at least).

    Raises:
      UserError: a .wav output for more than one sentence; an output directory that is
        a file.
    """
    if output.lower().endswith(".wav"):
        if len(sentences) > 1:
            raise UserError(
                f"--output {output} is one file but the text has {len(sentences)} "
                "sentences: give a directory"
            )
        return [output]
    if os.path.exists(output) and not os.path.isdir(output):
        raise UserError(f"--output {output} is a file, not a directory")
    width = max(4, len(str(sentences[-1].line)))
    return [os.path.join(output, f"{s.line:0{width}d}.wav") for s in sentences]


def vocoded(synth: Synthesizer, mels: list[np.ndarray], vocoder: str) -> list[np.ndarray]:
    """(T_i * hop,) float32 audio of each log-mel: Griffin-Lim (`vocoder` "griffin_lim",
    or no neural vocoder) or the synthesizer's neural vocoder."""
    if vocoder == "griffin_lim" or synth.vocoder is None:
        return [griffin_lim(m, synth.features) for m in mels]
    return [np.asarray(a, np.float32) for a in synth.vocoder(mels)]


def synthesize_to_files(
    synth: Synthesizer,
    lines: list[tuple[int, str]],
    speaker: str,
    output: str,
    *,
    duration_scale: float = 1.0,
    front_end: str = "espeak",
    voice: str | None = None,
    vocoder: str = "auto",
    progress: TextIO | None = None,
    tty: bool = False,
) -> dict:
    """Speak `lines` ((line number, text), `read_lines`) as `speaker` (name or id) into
    `output` (module docstring); `vocoder` "auto" (the neural one when `synth` has one)
    or "griffin_lim". Nothing is written until every sentence has been spoken. Returns
    {"files", "manifest" (None for one .wav), "sentences", "seconds", "vocoder"}.

    Raises:
      UserError: see the module docstring.
    """
    if not (math.isfinite(duration_scale) and duration_scale > 0):
        raise UserError(f"--duration_scale must be a number > 0, got {duration_scale}")
    sid = speaker_id(speaker, synth.speakers)
    name = sorted(synth.speakers, key=synth.speakers.get)[sid]
    sentences = phonemized(lines, synth.table, front_end, frontend.voice_for(name, voice))
    paths = output_paths(output, sentences)
    mels = spoken_mels(synth, sentences, sid, duration_scale)
    used = (
        "griffin_lim" if vocoder == "griffin_lim" or synth.vocoder is None else synth.vocoder_name
    )
    sr = synth.features.sample_rate
    meter = None
    if progress is not None and len(sentences) >= PROGRESS_FROM:
        meter = FileProgress("synthesize", len(sentences), progress, tty=tty, unit="sentences")
    rows, seconds = [], 0.0
    try:
        for part in _batches(len(sentences)):
            waves = vocoded(synth, [mels[i] for i in part], vocoder)
            for i, audio in zip(part, waves):
                s = sentences[i]
                if os.path.dirname(paths[i]):
                    os.makedirs(os.path.dirname(paths[i]), exist_ok=True)
                files.atomic_write(paths[i], wav_bytes(audio, sr))
                seconds += len(audio) / sr
                rows.append(
                    {
                        "audio_filepath": os.path.basename(paths[i]),
                        "line": s.line,
                        "text": s.text,
                        "input": s.input,
                        "phonemes": " ".join(s.tokens),
                        "speaker": name,
                        "duration": round(len(audio) / sr, 4),
                    }
                )
            if meter is not None:
                meter.update(float(part[-1] + 1))
    finally:
        if meter is not None:
            meter.close()
    manifest = None
    if len(paths) > 1 or paths[0] != output:
        manifest = os.path.join(output, MANIFEST)
        files.atomic_write(manifest, "".join(json.dumps(r) + "\n" for r in rows))
    return {
        "files": paths,
        "manifest": manifest,
        "sentences": len(sentences),
        "seconds": round(seconds, 2),
        "vocoder": used,
    }
