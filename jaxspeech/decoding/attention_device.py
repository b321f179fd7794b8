"""The device half of attention decoding (`decoding.attention`): the model's attention
decoder with its key/value cache and the CTC prefix scorer, on this process's first
device, and `AttentionSearch`, what `decoding.search.Searcher` binds for the aed_beam and
aed_rescore methods.

Every process decodes its own rows, so nothing here may be a collective: the decoder's
parameters are gathered to every process once, when the search is bound (a collective:
every process binds at the same point), then each process runs its utterances' searches
on its first device, outside the training mesh (as the fused RNN-T search does).
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from ml_collections import ConfigDict

from jaxspeech.decoding import attention, ctc_prefix
from jaxspeech.decoding import ctc as ctc_decoding
from jaxspeech.decoding.lm import Fusion
from jaxspeech.models.decoder import SOS_EOS, teacher_forcing
from jaxspeech.parallel import mesh as mesh_lib

LABEL_WIDTH = 16  # rescoring pads the n-best's labels to a multiple of this: few shapes


def options_from_config(decoding: ConfigDict, has_ctc: bool) -> attention.SearchOptions:
    """config.decoding -> the search's options; ctc_weight -1 (the default) is
    attention.CTC_WEIGHT with a CTC head and 0 without."""
    weight = float(decoding.get("ctc_weight", -1.0))
    if weight < 0:
        weight = attention.CTC_WEIGHT if has_ctc else 0.0
    return attention.SearchOptions(
        beam=int(decoding.beam),
        ctc_weight=weight,
        length_norm=bool(decoding.get("length_norm", True)),
        eos_threshold=float(decoding.get("eos_threshold", attention.EOS_THRESHOLD)),
        max_len_ratio=float(decoding.get("max_len_ratio", 0.0)),
    )


class CTCPrefixScorer:
    """`attention.CTCScorer` over (B, T, V) CTC log-probs with (B,) valid frames, `beam`
    rows per utterance, on the default device (`ctc_prefix`)."""

    def __init__(self, logp_btv: Any, len_b: Any, beam: int, *, blank_id: int, eos: int):
        self.logp = jnp.asarray(logp_btv, jnp.float32)
        n = self.logp.shape[0] * beam
        self.utt = jnp.arange(n) // beam
        self.len_n = jnp.asarray(np.repeat(np.asarray(len_b), beam), jnp.int32)
        self.blank_id, self.eos = blank_id, eos

    def start(self) -> None:
        self.r = ctc_prefix.initial_state(self.logp, self.utt, self.blank_id)
        self.last = jnp.full(self.utt.shape, -1, jnp.int32)

    def score(self, cand_nc: np.ndarray) -> np.ndarray:
        self.cand = jnp.asarray(cand_nc, jnp.int32)
        psi, self.r_cand = ctc_prefix.prefix_scores(
            self.r,
            self.last,
            self.logp,
            self.utt,
            self.len_n,
            self.cand,
            blank_id=self.blank_id,
            eos_id=self.eos,
        )
        return np.asarray(psi, np.float64)

    def keep(self, src_n: np.ndarray, col_n: np.ndarray) -> None:
        self.r, self.last = _pick(self.r_cand, self.cand, jnp.asarray(src_n), jnp.asarray(col_n))


@jax.jit
def _pick(r_nct2, cand_nc, src_n, col_n):
    """Row n <- row src_n[n]'s candidate col_n[n]: its (T, 2) state and its label."""
    return r_nct2[src_n, col_n], cand_nc[src_n, col_n]


# The decoder's device functions, jitted once per process: the decoder's graph (hashable)
# is a static argument, so every search bound to the same model (each evaluation, each
# in-loop sample) reuses the compiled programs instead of tracing new closures.
@functools.partial(jax.jit, static_argnames=("dec_def", "beam", "max_len"))
def _start(dec_def, state, enc_bte, enc_len_b, beam: int, max_len: int):
    dec = nnx.merge(dec_def, state)
    cache = dec.start(enc_bte, enc_len_b, beam, max_len)
    sos = jnp.full((enc_bte.shape[0] * beam,), SOS_EOS, jnp.int32)
    return dec.step(cache, sos, 0)


@functools.partial(jax.jit, static_argnames=("dec_def",))
def _step(dec_def, state, cache, src_n, tokens_n, pos):
    dec = nnx.merge(dec_def, state)
    return dec.step(dec.reorder(cache, src_n), tokens_n, pos)


@functools.partial(jax.jit, static_argnames=("dec_def",))
def _teacher(dec_def, state, enc_bte, enc_len_b, utt_m, labels_mu, label_len_m):
    """(M,) log P(labels + <eos>) by teacher forcing (the training pass, deterministic)."""
    dec = nnx.merge(dec_def, state)
    inputs, targets = teacher_forcing(labels_mu, label_len_m)
    logits = dec(inputs, enc_bte[utt_m], enc_len_b[utt_m])
    logp = jnp.take_along_axis(jax.nn.log_softmax(logits), targets[..., None], -1)[..., 0]
    upto = jnp.arange(targets.shape[1])[None] <= label_len_m[:, None]  # <eos> included
    return jnp.sum(jnp.where(upto, logp, 0.0), axis=1)


class DecoderOnDevice:
    """The model's attention decoder on this process's first device (see the module
    docstring): `scorer` (an `attention.AttentionScorer` over a batch's encodings) and
    `teacher_scores` (log P(labels + <eos>) of whole hypotheses, for rescoring)."""

    def __init__(self, graphdef, params: dict, model_vars: dict):
        model = nnx.merge(graphdef, params, model_vars)
        self.dec_def, dec_state = nnx.split(model.decoder)
        device = jax.local_devices()[0]
        self.state = jax.device_put(mesh_lib.gather_to_host(dec_state), device)
        self.mesh = mesh_lib.make_mesh({"data": 1}, devices=[device])

    def scorer(self, enc_bte: np.ndarray, enc_len_b: np.ndarray, beam: int, max_len: int):
        """An `attention.AttentionScorer` over B utterances' (B, T, E) encodings, `beam`
        rows each, for prefixes of up to `max_len` labels."""
        return _CachedScorer(self, enc_bte, enc_len_b, beam, max_len)

    def teacher_scores(
        self, enc_bte: np.ndarray, enc_len_b: np.ndarray, utt_m: np.ndarray, labels: list
    ) -> np.ndarray:
        """(M,) log P_att(labels_m + <eos>) of M hypotheses of utterances utt_m, in one
        batch (rows padded to a power of two and labels to a multiple of LABEL_WIDTH: few
        compiled shapes)."""
        m = len(labels)
        rows = max(8, 1 << (m - 1).bit_length())
        width = LABEL_WIDTH * max(1, -(-max(len(y) for y in labels) // LABEL_WIDTH))
        padded = np.zeros((rows, width), np.int32)
        lens, utt = np.zeros(rows, np.int32), np.zeros(rows, np.int32)
        for i, y in enumerate(labels):
            padded[i, : len(y)], lens[i], utt[i] = y, len(y), utt_m[i]
        with jax.set_mesh(self.mesh):
            out = _teacher(self.dec_def, self.state, enc_bte, enc_len_b, utt, padded, lens)
        return np.asarray(out, np.float64)[:m]


class _CachedScorer:
    """`attention.AttentionScorer` through `DecoderOnDevice`'s cached step."""

    def __init__(self, device: DecoderOnDevice, enc_bte, enc_len_b, beam: int, max_len: int):
        self.device, self.enc, self.enc_len = device, enc_bte, enc_len_b
        self.beam, self.max_len = beam, max_len

    def start(self) -> tuple[np.ndarray, np.ndarray]:
        d = self.device
        with jax.set_mesh(d.mesh):
            logp, self.cache, align = _start(
                d.dec_def, d.state, self.enc, self.enc_len, beam=self.beam, max_len=self.max_len + 1
            )
        return np.asarray(logp, np.float64), np.asarray(align)

    def step(self, src_n: np.ndarray, tokens_n: np.ndarray, pos: int):
        d = self.device
        with jax.set_mesh(d.mesh):
            logp, self.cache, align = _step(
                d.dec_def,
                d.state,
                self.cache,
                jnp.asarray(src_n, jnp.int32),
                jnp.asarray(tokens_n, jnp.int32),
                jnp.int32(pos),
            )
        return np.asarray(logp, np.float64), np.asarray(align)


class AttentionSearch:
    """hyps(out) for the aed_beam and aed_rescore methods: `make_decode_fn`'s host-local
    outputs ("enc", "lengths", and "logprobs" with a CTC head) -> one label list per row,
    or with `with_frames` (labels, frames) pairs: frames from the CTC alignment with a CTC
    head, else from the decoder's cross-attention (the frame each label's step attended
    most)."""

    def __init__(
        self,
        method: str,
        decoder: DecoderOnDevice,
        options: attention.SearchOptions,
        *,
        blank_id: int,
        fusion: Fusion | None,
        with_frames: bool,
    ):
        self.method, self.decoder, self.options = method, decoder, options
        self.blank_id, self.fusion, self.with_frames = blank_id, fusion, with_frames

    def __call__(self, out: dict) -> list:
        enc, lengths = out["enc"], np.asarray(out["lengths"])
        logp = out.get("logprobs")
        if self.method == "aed_rescore":
            best = self._rescore(enc, lengths, logp)
        else:
            best = self._beam(enc, lengths, logp)
        if not self.with_frames:
            return [h.labels for h in best]
        return [self._frames(h, lp, n) for h, lp, n in zip(best, _rows(logp, best), lengths)]

    def _beam(self, enc, lengths, logp) -> list[attention.Hypothesis]:
        opts = self.options
        with_ctc = opts.ctc_weight > 0
        width = int(attention.max_lengths(np.array([enc.shape[1]]), opts, with_ctc)[0])
        att = self.decoder.scorer(enc, lengths, opts.beam, width)
        ctc = None
        if with_ctc:
            ctc = CTCPrefixScorer(logp, lengths, opts.beam, blank_id=self.blank_id, eos=SOS_EOS)
        hyps = attention.beam_search(att, ctc, lengths, opts, eos=SOS_EOS, fusion=self.fusion)
        return [h[0] for h in hyps]

    def _rescore(self, enc, lengths, logp) -> list[attention.Hypothesis]:
        nbest = [
            ctc_decoding.ctc_prefix_beam_search(
                lp, int(n), beam=self.options.beam, blank_id=self.blank_id, fusion=self.fusion
            )
            for lp, n in zip(np.asarray(logp), lengths)
        ]

        def att_scores(utt_m, labels):
            return self.decoder.teacher_scores(enc, lengths, utt_m, labels)

        return attention.rescore(nbest, att_scores, self.options.ctc_weight, self.fusion)

    def _frames(self, h: attention.Hypothesis, logp_tv, n: int) -> tuple[list[int], Any]:
        if logp_tv is not None:
            try:
                return h.labels, ctc_decoding.ctc_align(logp_tv[: int(n)], h.labels, self.blank_id)
            except ValueError:  # more labels than the frames allow: no CTC path
                pass
        return h.labels, h.frames


def _rows(logp, best: list) -> list:
    """Each row's CTC log-probs, or None each without a CTC head."""
    return list(np.asarray(logp)) if logp is not None else [None] * len(best)
