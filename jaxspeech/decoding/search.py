"""Decoding a run's model with config.decoding: the device half (`make_decode_fn`) and the
host half (`Searcher`), shared by evaluation, training's samples and transcription.

config.decoding.method picks the search; `lm_path` (an ARPA or KenLM file, built with
`python -m data_prep.lm`) with `lm_weight` and `word_bonus` fuses a word n-gram LM into
the beam searches:

- ctc_greedy: argmax on device, collapse on the host (no LM).
- ctc_beam: log-probs on device, prefix beam search on the host, with the LM if given.
- rnnt_greedy: on device (no LM).
- rnnt_beam: modified beam search on device; with an LM, the encoder's projection on device
  and the fused search on the host (`decoding.rnnt_fusion`), calling the predictor and
  joiner on this process's first device.
- aed_beam: attention beam search (`decoding.attention`), joint with CTC prefix scores when
  the model has a CTC head (decoding.ctc_weight), with the LM if given: the encodings on
  device, the search on the host, the decoder's cached step on this process's first device.
- aed_rescore: CTC prefix beam search (with the LM if given), its n-best rescored by the
  attention decoder.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from ml_collections import ConfigDict

from jaxspeech.common.errors import UserError
from jaxspeech.data.tokenizer import Tokenizer
from jaxspeech.decoding import attention_device
from jaxspeech.decoding import ctc as ctc_decoding
from jaxspeech.decoding import rnnt as rnnt_decoding
from jaxspeech.decoding.lm import fusion_from_config
from jaxspeech.decoding.rnnt_fusion import PredictorBeam, rnnt_beam_search_fused
from jaxspeech.models import inference
from jaxspeech.parallel import mesh as mesh_lib

DECODERS = ("ctc_greedy", "ctc_beam", "rnnt_greedy", "rnnt_beam", "aed_beam", "aed_rescore")
BEAMS = ("ctc_beam", "rnnt_beam", "aed_beam", "aed_rescore")  # the searches that fuse an LM
# LM fusion's default weight and word bonus: the best of a grid on the demo's dev set
# (benchmarks/lm_fusion.py, CTC prefix beam search of width 32, a trigram of the train
# transcripts); retune them for another model or LM.
LM_WEIGHT, WORD_BONUS = 1.2, 10.0
# A beam search may take at most this share of the memory it runs in (`beam_mistake`):
# the model, its encodings and the compiled programs need the rest.
BEAM_MEMORY_SHARE = 0.5


def decoding_method(config: ConfigDict) -> str:
    """config.decoding.method, with "auto" resolved (the head's greedy search, its beam
    search when decoding.lm_path is set; ctc+aed: CTC's, the cheap one for in-loop
    evaluation; aed alone: aed_beam) and checked against the model's head.

    Raises:
      ValueError: an unknown method, or one the model's head cannot run (each one line).
    """
    method, heads = config.decoding.method, config.model.head.split("+")
    if method == "auto":  # the head's greedy search, its beam search with an LM
        search = "beam" if config.decoding.get("lm_path", "") else "greedy"
        if "rnnt" in heads:
            return f"rnnt_{search}"
        return f"ctc_{search}" if "ctc" in heads else "aed_beam"
    if method not in DECODERS:
        raise ValueError(f"decoding.method must be auto or one of {DECODERS}, got {method!r}")
    if method.split("_")[0] not in heads:
        raise ValueError(f"decoding.method {method!r} needs a model with that head, not {heads}")
    if method == "aed_rescore" and "ctc" not in heads:
        raise ValueError(
            "decoding.method 'aed_rescore' rescores a CTC n-best; model.head 'aed' has no "
            "CTC head (use aed_beam)"
        )
    return method


def has_ctc(config: ConfigDict) -> bool:
    """Whether the model has a CTC head."""
    return "ctc" in config.model.head.split("+")


def uses_lm(config: ConfigDict) -> bool:
    """Whether config.decoding fuses an LM: a path is set and the method is a beam search.

    Raises:
      ValueError: an LM with a greedy method (it would be ignored).
    """
    if not config.decoding.get("lm_path", ""):
        return False
    method = decoding_method(config)
    if method not in BEAMS:
        raise ValueError(
            f"decoding.lm_path is set but decoding.method {method!r} is greedy; "
            f"LM fusion needs one of {BEAMS}"
        )
    return True


def beam_bytes(method: str, beam: int, vocab: int, rows: int, frames: int, symbols: int) -> int:
    """Rough peak bytes of one batch's beam search beyond the model (its largest arrays):
    `rows` utterances of up to `frames` encoder frames, K = `beam`, V = `vocab`, up to
    `symbols` labels a frame (rnnt_beam).

    rnnt_beam (on device): per expansion (B*K, V) log-probs and the K*V candidates' scores
    and indices, the pairwise merge of equal hypotheses (B, K, K) (keys, done and score:
    ~6 arrays), and the back-pointers and labels of every expansion (T*S, B, K) int32.
    aed_beam / aed_rescore: the joint CTC prefix scorer's (B*K, ceil(1.5K), T, 2) float32
    and the decoder's (B*K, V) log-probs. ctc_beam (host, one utterance at a time): the
    K*V candidates of a frame.
    """
    k, n = beam, rows * beam
    if method == "rnnt_beam":
        return 12 * n * vocab + 24 * rows * k * k + 8 * frames * symbols * n
    if method.startswith("aed"):
        return 8 * n * math.ceil(1.5 * k) * frames + 8 * n * vocab
    if method == "ctc_beam":
        return 24 * k * vocab
    return 0


def memory_limit_bytes() -> int:
    """The memory a search runs in: the first device's (its allocator's limit), or the
    host's physical memory on a CPU backend (which reports none)."""
    try:  # this process's own device: other processes' report nothing here
        stats = jax.local_devices()[0].memory_stats() or {}
    except jax.errors.JaxRuntimeError:  # a backend without memory statistics
        stats = {}
    if stats.get("bytes_limit"):
        return int(stats["bytes_limit"])
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def beam_mistake(config: ConfigDict, vocab: int, limit_bytes: int) -> str:
    """Why config.decoding.beam cannot run ('' if it can), checked before any work: a
    search whose `beam_bytes` exceed `BEAM_MEMORY_SHARE` of `limit_bytes`. The batch is the
    eval buckets' widest (data.batch_seconds over the shortest bucket) of their longest
    utterances, in encoder frames at x4 subsampling (the least any encoder has: an
    overestimate for x8). No bound by the vocabulary: prefix searches keep distinct label
    sequences, which outnumber the labels after a few frames (a CTC beam of 32 over a
    30-character vocabulary is usual)."""
    method = decoding_method(config)
    if method not in BEAMS:
        return ""
    beam = int(config.decoding.beam)
    data = config.data
    bounds = list(data.get("eval_bucket_boundaries") or data.bucket_boundaries)
    rows = max(1, math.ceil(float(data.batch_seconds) / min(bounds)))
    hop = int(config.features.hop_length) * 4
    frames = math.ceil(max(bounds) * int(config.features.sample_rate) / hop)
    symbols = int(config.decoding.get("max_symbols_per_frame", 1))
    need = beam_bytes(method, beam, vocab, rows, frames, symbols)
    if need > BEAM_MEMORY_SHARE * limit_bytes:
        return (
            f"decoding.beam {beam}: {method} would need about {need / 2**30:.1f} GiB for a "
            f"batch of {rows} utterances of up to {max(bounds):g} s, over half of the "
            f"{limit_bytes / 2**30:.1f} GiB it runs in; give a smaller beam"
        )
    return ""


def make_decode_fn(graphdef, config: ConfigDict, blank_id: int) -> Callable:
    """decode(params, model_vars, audio, audio_len) -> device outputs for `Searcher`."""
    method, dec = decoding_method(config), config.decoding
    host_rnnt = method == "rnnt_beam" and uses_lm(config)

    @jax.jit
    def decode(params, model_vars, audio_bs, audio_len_b):
        model = nnx.merge(graphdef, params, model_vars)
        enc, lengths = model(audio_bs, audio_len_b, train=False)
        if method == "ctc_greedy":
            return {"ids": ctc_decoding.greedy_ids(model.ctc_logits(enc)), "lengths": lengths}
        if method == "ctc_beam":
            return {"logprobs": jax.nn.log_softmax(model.ctc_logits(enc)), "lengths": lengths}
        if method.startswith("aed"):
            out = {"enc": enc.astype(jnp.float32), "lengths": lengths}
            if model.ctc is not None:  # joint scores, rescoring, word times
                out["logprobs"] = jax.nn.log_softmax(model.ctc_logits(enc))
            return out
        tr = model.transducer
        enc_proj = tr.joiner.enc_proj(enc)
        if host_rnnt:
            return {"enc_proj": enc_proj.astype(jnp.float32), "lengths": lengths}
        pred_init, pred_step, joint = tr.decoder_fns()
        if method == "rnnt_greedy":
            tokens, num, frames = rnnt_decoding.rnnt_greedy(
                enc_proj,
                lengths,
                pred_init,
                pred_step,
                joint,
                blank_id=blank_id,
                max_symbols_per_frame=dec.max_symbols_per_frame,
                with_frames=True,
            )
        else:
            tokens, num, _, frames = rnnt_decoding.rnnt_modified_beam_search(
                enc_proj,
                lengths,
                pred_init,
                pred_step,
                joint,
                beam=dec.beam,
                blank_id=blank_id,
                max_symbols_per_frame=dec.max_symbols_per_frame,
                with_frames=True,
            )
        return {"tokens": tokens, "num_tokens": num, "frames": frames}

    return decode


def make_head_fn(graphdef, config: ConfigDict, blank_id: int) -> Callable:
    """heads(params, model_vars, outputs, lengths) -> the decode outputs of `make_decode_fn`,
    from a streaming encoder's head outputs (CTC log-probs (B, T, V) or the transducer's
    enc_proj (B, T, J)) instead of audio."""
    method, dec = decoding_method(config), config.decoding
    if method == "ctc_greedy":
        return lambda params, model_vars, logp, lengths: {
            "ids": np.asarray(logp).argmax(-1),
            "lengths": np.asarray(lengths),
        }
    if method == "ctc_beam" or uses_lm(config):
        key = "logprobs" if method == "ctc_beam" else "enc_proj"
        return lambda params, model_vars, x, lengths: {key: x, "lengths": np.asarray(lengths)}

    @jax.jit
    def rnnt_search(params, model_vars, enc_proj, lengths):
        pred_init, pred_step, joint = nnx.merge(
            graphdef, params, model_vars
        ).transducer.decoder_fns()
        args = (enc_proj, lengths, pred_init, pred_step, joint)
        if method == "rnnt_greedy":
            tokens, num, frames = rnnt_decoding.rnnt_greedy(
                *args,
                blank_id=blank_id,
                max_symbols_per_frame=dec.max_symbols_per_frame,
                with_frames=True,
            )
        else:
            tokens, num, _, frames = rnnt_decoding.rnnt_modified_beam_search(
                *args,
                beam=dec.beam,
                blank_id=blank_id,
                max_symbols_per_frame=dec.max_symbols_per_frame,
                with_frames=True,
            )
        return {"tokens": tokens, "num_tokens": num, "frames": frames}

    return lambda *a: jax.device_get(rnnt_search(*a))


class StreamDecoder:
    """config.decoding.streaming: each utterance goes through the model's stream functions
    chunk by chunk (`models.inference`: stream_first, stream_step, then stream_flush; or
    stream_flush_first alone for audio shorter than the first chunk), as a streaming
    server would feed it, one stream per utterance on this process's first device. The
    head outputs of a batch's rows are padded into one array and decoded as
    `make_decode_fn`'s would be; they equal the masked full-sequence pass's.

    `max_seconds`: the longest audio it will see; models with unlimited left context keep
    that much attention cache (so the outputs equal the full pass's).

    Raises:
      UserError: the model does not stream (a causal Conformer with chunk_size > 0).
    """

    def __init__(
        self, graphdef, params, model_vars, config: ConfigDict, blank_id: int, max_seconds: float
    ):
        model = nnx.merge(graphdef, params, model_vars)
        if not inference.streamable(model):
            raise UserError(
                "decoding.streaming needs a streaming encoder (a Conformer with causal=True "
                "and chunk_size > 0)"
            )
        rate = int(config.features.sample_rate)
        history = int(np.ceil(max_seconds * rate / model.frame_samples)) + 1
        host = mesh_lib.gather_to_host((params, model_vars))
        device = jax.local_devices()[0]
        self.params, self.model_vars = jax.device_put(host, device)
        fns = inference.inference_functions(
            graphdef, *host, stream_history=history if model.encoder.left_chunks < 0 else None
        )
        self.jitted = {k: jax.jit(fns[k]) for k in inference.STREAM_FUNCTIONS}
        self.info = fns["stream_first"].stream
        # The head output the decoder reads: CTC log-probs or the transducer's enc_proj.
        wanted = "log_probs" if decoding_method(config).startswith("ctc") else "enc_proj"
        self.output = self.info.outputs.index(wanted)
        self.one_device = mesh_lib.make_mesh({"data": 1}, devices=[device])
        self.heads = make_head_fn(graphdef, config, blank_id)

    def utterance(self, audio: np.ndarray) -> np.ndarray:
        """(S,) audio -> (T, V or J) head outputs of its valid frames, chunk by chunk."""
        s1, s2, n = self.info.first_samples, self.info.step_samples, len(audio)
        f, k, pick = self.jitted, len(self.info.outputs), self.output
        outs, valids = [], []
        if n < s1:
            x = np.zeros((1, s1), np.float32)
            x[0, :n] = audio
            r = f["stream_flush_first"](x, np.array([n], np.int32))
        else:
            r = f["stream_first"](audio[None, :s1])
            pos = s1
            while n - pos > s2:
                outs.append(r[pick])
                valids.append(r[k])
                r = f["stream_step"](*r[k + 1 :], audio[None, pos : pos + s2])
                pos += s2
            outs.append(r[pick])
            valids.append(r[k])
            x = np.zeros((1, s2), np.float32)
            x[0, : n - pos] = audio[pos:]
            r = f["stream_flush"](*r[k + 1 :], x, np.array([n - pos], np.int32))
        outs.append(r[pick])
        valids.append(r[k])
        out, valid = np.concatenate(outs, 1)[0], np.concatenate(valids, 1)[0]
        return out[valid]

    def __call__(self, audio_bs: np.ndarray, lengths_b: np.ndarray) -> dict:
        """Host-local rows -> decode outputs (as `make_decode_fn`'s, host-local)."""
        with jax.set_mesh(self.one_device):
            rows = [
                self.utterance(np.asarray(a[:n], np.float32)) for a, n in zip(audio_bs, lengths_b)
            ]
            lengths = np.array([len(r) for r in rows], np.int32)
            width = max(1, int(lengths.max(initial=0)))
            width = 32 * -(-width // 32)  # few shapes for the jitted RNN-T searches
            padded = np.zeros((len(rows), width, rows[0].shape[-1]), np.float32)
            for i, r in enumerate(rows):
                padded[i, : len(r)] = r
            return self.heads(self.params, self.model_vars, padded, lengths)


def predictor_beam(graphdef, params: dict, model_vars: dict, blank_id: int) -> PredictorBeam:
    """The transducer's predictor and joiner as `rnnt_fusion.PredictorBeam`, on this
    process's first device, outside any mesh: every process runs its own utterances'
    searches, so none of their calls may be a collective. The parameters are gathered
    to every process first (a collective: every process builds this at the same point)."""
    model = nnx.merge(graphdef, params, model_vars)
    tr_def, tr_state = nnx.split(model.transducer)
    device = jax.local_devices()[0]
    local_state = jax.device_put(mesh_lib.gather_to_host(tr_state), device)
    one_device = mesh_lib.make_mesh({"data": 1}, devices=[device])

    @jax.jit
    def init(state, k_rows):
        pred_init, pred_step, _ = nnx.merge(tr_def, state).decoder_fns()
        blank = jnp.full((k_rows.shape[0],), blank_id, jnp.int32)
        return pred_step(pred_init(k_rows.shape[0]), blank)

    @jax.jit
    def logp(state, carry, enc_d):
        _, _, joint = nnx.merge(tr_def, state).decoder_fns()
        pred = carry[0]
        enc_kd = jnp.broadcast_to(enc_d.astype(pred.dtype), (pred.shape[0], enc_d.shape[-1]))
        return jax.nn.log_softmax(joint(enc_kd, pred).astype(jnp.float32), axis=-1)

    @jax.jit
    def advance(state, carry, src_k, tokens_k, label_k):
        _, pred_step, _ = nnx.merge(tr_def, state).decoder_fns()
        src = jax.tree.map(lambda x: x[src_k], carry)
        stepped = pred_step(src[1], jnp.where(label_k, tokens_k, blank_id))
        return rnnt_decoding.select_rows(label_k, stepped, src)

    def on_device(fn: Callable) -> Callable:
        def call(*args):
            with jax.set_mesh(one_device):
                return fn(local_state, *args)

        return call

    return PredictorBeam(
        init=lambda k: on_device(init)(np.zeros(k, np.int32)),
        logp=lambda carry, enc_d: np.asarray(on_device(logp)(carry, enc_d)),
        advance=on_device(advance),
    )


class Searcher:
    """The host half of config.decoding for one tokenizer (and, for the fused RNN-T search,
    one model): `searcher.bind(params, model_vars)` -> hyps(out) -> one label list per row
    of a batch's host-local `make_decode_fn` outputs; with `with_frames`, (labels, frames)
    pairs, the encoder frame where each label starts (for timestamps). The LM is loaded
    once, here.

    Raises:
      UserError: see `decoding.lm.NgramLM`; a beam too wide for the memory
        (`beam_mistake`). ValueError: see `uses_lm`.
    """

    def __init__(self, config: ConfigDict, tokenizer: Tokenizer, graphdef: Any = None):
        self.config, self.graphdef = config, graphdef
        self.blank_id = tokenizer.blank_id
        self.method = decoding_method(config)
        mistake = beam_mistake(config, tokenizer.vocab_size, memory_limit_bytes())
        if mistake:
            raise UserError(mistake)
        self.fusion = fusion_from_config(config.decoding, tokenizer) if uses_lm(config) else None

    def bind(self, params: dict, model_vars: dict, with_frames: bool = False) -> Callable:
        """hyps(out) for decode outputs of these parameters."""
        beam, blank = int(self.config.decoding.beam), self.blank_id
        max_sym = int(self.config.decoding.max_symbols_per_frame)
        if self.method.startswith("aed"):
            if self.graphdef is None:
                raise ValueError(f"decoding.method {self.method!r} needs the model's graph")
            return attention_device.AttentionSearch(
                self.method,
                attention_device.DecoderOnDevice(self.graphdef, params, model_vars),
                attention_device.options_from_config(self.config.decoding, has_ctc(self.config)),
                blank_id=blank,
                fusion=self.fusion,
                with_frames=with_frames,
            )
        if self.method == "rnnt_beam" and self.fusion:
            model = predictor_beam(self.graphdef, params, model_vars, blank)

            def fused_rnnt(out: dict) -> list:
                best = [
                    rnnt_beam_search_fused(
                        enc,
                        n,
                        model,
                        self.fusion,
                        beam=beam,
                        blank_id=blank,
                        max_symbols_per_frame=max_sym,
                    )[0]
                    for enc, n in zip(out["enc_proj"], out["lengths"])
                ]
                return [(h.tokens, h.frames) if with_frames else h.tokens for h in best]

            return fused_rnnt
        return lambda out: self.hypotheses(out, with_frames)

    def hypotheses(self, out: dict, with_frames: bool = False) -> list:
        """Label lists (or (labels, frames) pairs) of decode outputs that need no model on
        the host."""
        if "ids" in out:
            pairs = ctc_decoding.collapse_with_frames(out["ids"], out["lengths"], self.blank_id)
            return pairs if with_frames else [labels for labels, _ in pairs]
        if "logprobs" in out:
            labels = ctc_decoding.ctc_beam_search_batch(
                out["logprobs"],
                out["lengths"],
                beam=int(self.config.decoding.beam),
                blank_id=self.blank_id,
                fusion=self.fusion,
            )
            if not with_frames:
                return labels
            return [
                (y, ctc_decoding.ctc_align(lp[: int(n)], y, self.blank_id))
                for y, lp, n in zip(labels, out["logprobs"], out["lengths"])
            ]
        labels = rnnt_decoding.to_lists(out["tokens"], out["num_tokens"])
        if not with_frames:
            return labels
        frames = rnnt_decoding.to_lists(out["frames"], out["num_tokens"])
        return list(zip(labels, frames))
