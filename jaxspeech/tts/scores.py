"""Scores of one synthesized utterance against its recording, on the host (numpy,
librosa, the `pesq` package), and their means over a split.

Each utterance is synthesized twice (`jaxspeech.tts.evaluation`): with the model's
own durations ("predicted", the real use) and with the recording's phoneme durations
("aligned": the same number of frames, each phoneme where the recording has it). A measure
that compares time-aligned signals is taken on the aligned one:

- mcd_db: MCD-DTW (`metrics.speech.mcd_dtw_against`) of the predicted speech; DTW absorbs
  the difference in timing, so this is the synthesizer as it is used;
- pesq: wide-band PESQ (ITU-T P.862.2, MOS-LQO 1.0-4.64) of the aligned speech, at
  16 kHz. PESQ aligns only small delays: it needs the two signals in step, which the
  predicted durations never are;
- f0_rmse_hz, f0_rmse_cents, voicing_error: `metrics.speech.f0_rmse_against` of the aligned
  speech;
- dnsmos_sig, dnsmos_bak, dnsmos_ovrl, dnsmos_p808: DNSMOS P.835 and P.808 estimates of a
  listening test's MOS (`metrics.mos`, 1-5) of the predicted speech alone (no reference:
  the recordings are scored the same way), None in `score_utterance`'s row until
  `dnsmos_scores` of the same speech is added to it (`add_dnsmos`): the evaluation scores
  DNSMOS in a thread of its own.

A measure that cannot be taken (PESQ finds no speech in the reference, a reference with
no voiced frame for F0) is None, with the reason in the row's "unscored".
"""

from __future__ import annotations

import math

import numpy as np
import soxr

from jaxspeech.metrics.mos import Dnsmos
from jaxspeech.metrics.speech import Reference, f0_rmse_against, mcd_dtw_against

PESQ_RATE = 16000  # wide-band PESQ is defined at 16 kHz only
DNSMOS = ("dnsmos_sig", "dnsmos_bak", "dnsmos_ovrl", "dnsmos_p808")
MEASURES = ("mcd_db", "pesq", "f0_rmse_hz", "f0_rmse_cents", "voicing_error", *DNSMOS)
COUNTS = {
    "mcd_db": "mcd_utterances",
    "pesq": "pesq_utterances",
    "f0_rmse_hz": "f0_utterances",
    "dnsmos_ovrl": "dnsmos_utterances",
}


def pesq_wb(ref: np.ndarray, deg: np.ndarray, sample_rate: int) -> float:
    """Wide-band PESQ of (S2,) `deg` against the time-aligned (S,) reference `ref`, float
    waveforms at `sample_rate` Hz (resampled to 16 kHz first where it differs; `deg` cut
    or zero-padded to the reference's length, as the two are in step).

    Raises:
      ValueError: PESQ cannot score the pair (a silent signal, no speech found in the
        reference, or under a quarter second of audio).
    """
    # Imported here, not with the module: `python -m jaxspeech.evaluate` imports this module
    # for every run, and a recognizer's evaluation should not need PESQ's C extension.
    from pesq import PesqError, pesq

    ref = np.asarray(ref, np.float64)
    deg = np.asarray(deg, np.float64)
    deg = np.pad(deg[: len(ref)], (0, max(0, len(ref) - len(deg))))
    if sample_rate != PESQ_RATE:
        ref = soxr.resample(ref, sample_rate, PESQ_RATE)
        deg = soxr.resample(deg, sample_rate, PESQ_RATE)
    # pesq scales each signal by its peak: a silent one would be NaN, not an error.
    for name, x in (("reference", ref), ("synthesized speech", deg)):
        if not np.any(x):
            raise ValueError(f"PESQ: the {name} is silent")
    try:
        return float(pesq(PESQ_RATE, ref, deg, "wb"))
    except PesqError as e:  # NoUtterancesError, BufferTooShortError: the pair, not a bug
        raise ValueError(f"PESQ: {type(e).__name__}: {e}") from e


def _finite(x: float) -> float | None:
    """A float for JSON: None for NaN or infinity (JSON has neither)."""
    return round(float(x), 4) if math.isfinite(x) else None


def dnsmos_scores(scorer: Dnsmos, wave: np.ndarray, sample_rate: int) -> dict:
    """{"dnsmos_sig", "dnsmos_bak", "dnsmos_ovrl", "dnsmos_p808": value} of one (S,)
    waveform; all None with "unscored": {"dnsmos": why} where it cannot be scored (empty,
    non-finite). Samples outside [-1, 1] are clipped first, as a WAV file would be."""
    try:
        s = scorer.score(wave, sample_rate)
    except ValueError as e:
        return dict.fromkeys(DNSMOS) | {"unscored": {"dnsmos": str(e)}}
    return {f"dnsmos_{k}": _finite(getattr(s, k)) for k in ("sig", "bak", "ovrl", "p808")}


def add_dnsmos(row: dict, scores: dict) -> None:
    """`dnsmos_scores`' dict written into a `score_utterance` row (in place), its
    "unscored" reason beside the row's."""
    scores = dict(scores)
    unscored = scores.pop("unscored", {})
    row.update(scores)
    if unscored:  # a new dict: a row copied from another shares its "unscored"
        row["unscored"] = row.get("unscored", {}) | unscored


def score_utterance(
    ref: np.ndarray | Reference,
    predicted: np.ndarray,
    aligned: np.ndarray,
    sample_rate: int,
) -> dict:
    """The measures of the module docstring for one utterance: (S,) reference, (S1,)
    predicted and (S2,) aligned synthesized waveforms -> {measure: value or None} plus
    "unscored": {measure: why} for those that could not be taken. The DNSMOS measures
    are None (not asked for: not in "unscored"); `add_dnsmos` fills them.

    `ref` as a `metrics.speech.Reference` (at `sample_rate`): its mel cepstrum and F0,
    once computed, serve every vocoder scored against it."""
    if not isinstance(ref, Reference):
        ref = Reference(ref, sample_rate)
    elif ref.sample_rate != sample_rate:
        raise ValueError(f"reference at {ref.sample_rate} Hz, synthesized speech at {sample_rate}")
    out: dict = {k: None for k in MEASURES}
    unscored: dict[str, str] = {}
    try:
        out["mcd_db"] = _finite(mcd_dtw_against(ref, predicted))
    except ValueError as e:
        unscored["mcd_db"] = str(e)
    try:
        out["pesq"] = _finite(pesq_wb(ref.wave, aligned, sample_rate))
    except ValueError as e:
        unscored["pesq"] = str(e)
    try:
        f0 = f0_rmse_against(ref, aligned[: len(ref.wave)])
        out |= {k: _finite(f0[k]) for k in ("f0_rmse_hz", "f0_rmse_cents", "voicing_error")}
        if out["f0_rmse_hz"] is None:  # voiced in both nowhere: the voicing error says why
            unscored["f0_rmse_hz"] = "no frame voiced in both"
    except ValueError as e:
        unscored["f0_rmse_hz"] = str(e)
    return out | ({"unscored": unscored} if unscored else {})


def summarize(rows: list[dict], measures: tuple[str, ...] = MEASURES) -> dict:
    """Each of `measures`' mean over the rows that have it (None if none does), and how
    many do (`COUNTS`: mcd_utterances, pesq_utterances, f0_utterances,
    dnsmos_utterances)."""
    out: dict = {}
    for k in measures:
        values = [r[k] for r in rows if r.get(k) is not None]
        out[k] = round(float(np.mean(values)), 4) if values else None
        if k in COUNTS:
            out[COUNTS[k]] = len(values)
    return out
