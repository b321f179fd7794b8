"""jaxspeech.export's functions against the training code, in process: the StableHLO and
the ONNX (onnxruntime) artifacts of a streaming CTC+transducer model at two (B, S), one
longer than every training bucket; a greedy RNN-T search written here over the exported
pieces against `jaxspeech.decoding.rnnt.rnnt_greedy`; the stream functions chunk by
chunk against the whole utterance; reloading the StableHLO with jax alone in a fresh
process; the ONNX graph rewrite and the int8 quantization (of a full-context model)."""

import json
import os
import pathlib
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from configs import demo
from jaxspeech.config import build
from jaxspeech.decoding import ctc as ctc_decoding
from jaxspeech.decoding import rnnt as rnnt_decoding
from jaxspeech.serving import quantize
from jaxspeech.serving import recognizer_export as export_lib
from tests.conftest import onnx_converter
from tests.sharing import built_once

VOCAB = 12
RATE = 16000

ROOT = pathlib.Path(__file__).resolve().parents[1]
TRANSCRIBER = str(ROOT / "examples" / "transcribe_onnx.py")


CHUNK, LEFT_CHUNKS = 4, 2  # the streaming model's encoder frames per step, chunks cached


def _model(variant: str, *, streaming: bool = False, left_chunks: int = LEFT_CHUNKS):
    """A tiny model of configs/demo.py:tiny with `variant`'s head, seeded weights and
    non-trivial feature statistics: (graphdef, params, model_vars, config)."""
    config = demo.get_config("tiny")
    config.model.head = {"ctc": "ctc", "ctc_rnnt": "ctc+rnnt"}[variant]
    if streaming:
        conformer = config.model.conformer
        conformer.causal, conformer.chunk_size, conformer.left_chunks = True, CHUNK, left_chunks
    model = build.make_model(config, VOCAB, 3)
    graphdef, params, model_vars = nnx.split(model, nnx.Param, ...)
    f = config.features.num_mel_bins
    rng = np.random.default_rng(0)
    stats = build.feature_stats(rng.normal(-5, 1, f), rng.uniform(2, 4, f))
    return graphdef, nnx.to_pure_dict(params), stats, config


def _audio(b: int, s: int, seed: int):
    """(B, S) noise with ragged lengths (the last row full)."""
    rng = np.random.default_rng(seed)
    lengths = np.linspace(0.55 * s, s, b).astype(np.int32)
    audio = (0.1 * rng.standard_normal((b, s))).astype(np.float32)
    audio[np.arange(s)[None, :] >= lengths[:, None]] = 0.0
    return audio, lengths


def _loader(fmt: str, where, described: dict) -> dict:
    """name -> a function of numpy arrays returning a list of numpy arrays."""
    if fmt == "stablehlo":

        def load(d):
            exp = jax.export.deserialize((where / d["file"]).read_bytes())

            def call(*arrays):
                out = exp.call(*arrays)  # one output: an array, not a 1-tuple
                return [np.asarray(x) for x in (out if isinstance(out, tuple | list) else [out])]

            return call

    else:
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.log_severity_level = 3

        def load(d):
            session = ort.InferenceSession(str(where / d["file"]), options)
            names = [i.name for i in session.get_inputs()]
            return lambda *a: session.run(None, dict(zip(names, a, strict=True)))

    return {name: load(d) for name, d in described.items()}


@pytest.fixture(scope="module", params=["stablehlo", "onnx"])
def exported(request, tmp_path_factory):
    """A streaming CTC + transducer model (every exported function; converted once per
    format for the module): (model parts, loaded functions, manifest "functions",
    directory, format, the inference functions)."""
    graphdef, params, stats, config = _model("ctc_rnnt", streaming=True)
    fns = export_lib.inference_functions(graphdef, params, stats)

    def export_once(where: pathlib.Path) -> str:
        if request.param == "stablehlo":
            described = export_lib.export_stablehlo(fns, RATE, str(where))
        else:
            arguments = build.model_arguments(config, VOCAB)
            described = export_lib.export_onnx(
                arguments, params, stats, RATE, str(where), onnx_converter()
            )
        return json.dumps(described)

    # The ONNX conversion takes most of a minute: one per session, not one per worker.
    where, text = built_once(tmp_path_factory, f"exported-{request.param}", export_once)
    described = json.loads(text)
    loaded = _loader(request.param, where, described)
    return (graphdef, params, stats, config), loaded, described, where, request.param, fns


# Two shapes: the second (9 s) is longer than the tiny config's largest bucket (8 s).
SHAPES = [(2, 16000, 0), (3, 9 * RATE, 1)]


@pytest.mark.parametrize("b,s,seed", SHAPES)
def test_ctc_artifact_equals_the_training_code(exported, b, s, seed):
    (graphdef, params, stats, config), loaded, described, *_ = exported
    assert max(config.data.bucket_boundaries) * RATE < SHAPES[1][1]
    audio, lengths = _audio(b, s, seed)
    model = nnx.merge(graphdef, params, stats)
    enc, enc_len = model(jnp.asarray(audio), jnp.asarray(lengths), train=False)
    ref = np.asarray(jax.nn.log_softmax(model.ctc_logits(enc), -1))
    got, got_len = loaded["ctc"](audio, lengths)
    np.testing.assert_array_equal(got_len, enc_len)
    np.testing.assert_allclose(np.asarray(got), ref, atol=1e-4, rtol=0)
    # Greedy decoding of the artifact's output = the evaluator's greedy ids.
    ids = np.asarray(ctc_decoding.greedy_ids(model.ctc_logits(enc)))
    assert ctc_decoding.collapse(np.argmax(got, -1), got_len) == ctc_decoding.collapse(
        ids, np.asarray(enc_len)
    )
    assert described["ctc"]["inputs"] == [
        {"name": "audio", "shape": ["b", "s"], "dtype": "float32"},
        {"name": "audio_len", "shape": ["b"], "dtype": "int32"},
    ]
    assert [o["name"] for o in described["ctc"]["outputs"]] == ["log_probs", "lengths"]
    assert described["ctc"]["outputs"][0]["shape"][0] == "b"
    assert described["ctc"]["outputs"][0]["shape"][2] == str(VOCAB)


def _greedy_over_pieces(loaded, audio, lengths, blank, max_symbols):
    """RNN-T greedy search over the exported functions, one row at a time (numpy loop)."""
    enc, enc_len = (np.asarray(x) for x in loaded["encoder"](audio, lengths))
    out = []
    for i in range(len(audio)):
        state = loaded["predictor_init"](np.array([blank], np.int32))
        pred, *state = loaded["predictor_step"](*state, np.array([blank], np.int32))
        tokens = []
        for t in range(int(enc_len[i])):
            for _ in range(max_symbols):
                (logp,) = loaded["joiner"](enc[i : i + 1, t], pred)
                k = int(np.argmax(logp[0]))
                if k == blank:
                    break
                tokens.append(k)
                pred, *state = loaded["predictor_step"](*state, np.array([k], np.int32))
        out.append(tokens)
    return out


@pytest.mark.parametrize("b,s,seed", SHAPES)
def test_transducer_pieces_equal_the_training_code(exported, b, s, seed):
    (graphdef, params, stats, config), loaded, described, *_ = exported
    assert set(described) == {
        "ctc", "encoder", "predictor_init", "predictor_step", "joiner",
        "stream_first", "stream_step", "stream_flush", "stream_flush_first",
    }  # fmt: skip
    audio, lengths = _audio(b, s, seed)
    model = nnx.merge(graphdef, params, stats)
    enc, enc_len = model(jnp.asarray(audio), jnp.asarray(lengths), train=False)
    tr = model.transducer
    enc_proj = tr.joiner.enc_proj(enc)
    got_proj, got_len = loaded["encoder"](audio, lengths)
    np.testing.assert_array_equal(got_len, enc_len)
    np.testing.assert_allclose(np.asarray(got_proj), np.asarray(enc_proj), atol=1e-4, rtol=0)
    # One predictor step and the joiner on the first frame, against the model's parts.
    pred_init, pred_step, joint = tr.decoder_fns()
    tokens = jnp.arange(b, dtype=jnp.int32) + 1
    ref_pred, ref_state = pred_step(pred_init(b), tokens)
    state = loaded["predictor_init"](np.asarray(tokens))
    got_pred, *got_state = loaded["predictor_step"](*state, np.asarray(tokens))
    np.testing.assert_allclose(np.asarray(got_pred), np.asarray(ref_pred), atol=1e-5, rtol=0)
    for g, r in zip(got_state, jax.tree.leaves(ref_state), strict=True):
        np.testing.assert_array_equal(np.asarray(g), np.asarray(r))
    ref_logp = jax.nn.log_softmax(joint(enc_proj[:, 0], ref_pred), -1)
    (got_logp,) = loaded["joiner"](np.asarray(got_proj)[:, 0], np.asarray(got_pred))
    np.testing.assert_allclose(np.asarray(got_logp), np.asarray(ref_logp), atol=1e-4, rtol=0)
    # The whole greedy search over the pieces = the evaluator's batched greedy search.
    blank, max_symbols = 0, int(config.decoding.max_symbols_per_frame)
    ref_tokens, ref_num = rnnt_decoding.rnnt_greedy(
        enc_proj, enc_len, pred_init, pred_step, joint, blank_id=blank,
        max_symbols_per_frame=max_symbols,
    )  # fmt: skip
    want = rnnt_decoding.to_lists(np.asarray(ref_tokens), np.asarray(ref_num))
    assert _greedy_over_pieces(loaded, audio, lengths, blank, max_symbols) == want


def test_short_audio_is_padded_to_min_samples_by_the_runtime(exported):
    """Below the manifest's min_samples the artifact refuses the shape; zero-padded to it,
    with audio_len the true length, it decodes like the training code."""
    (graphdef, params, stats, _), loaded, _, _, fmt, _ = exported
    min_samples = int(export_lib.MIN_SECONDS * RATE)
    audio, _ = _audio(1, min_samples - 1, 0)
    if fmt == "stablehlo":  # onnxruntime does not check the bound; the manifest states it
        with pytest.raises(Exception, match="refining shapes"):
            loaded["ctc"](audio, np.array([min_samples - 1], np.int32))
    padded = np.zeros((1, min_samples), np.float32)
    padded[0, :1000] = audio[0, :1000]
    lengths = np.array([1000], np.int32)
    got, got_len = loaded["ctc"](padded, lengths)
    model = nnx.merge(graphdef, params, stats)
    enc, enc_len = model(jnp.asarray(padded), jnp.asarray(lengths), train=False)
    np.testing.assert_array_equal(got_len, enc_len)
    ref = jax.nn.log_softmax(model.ctc_logits(enc), -1)
    np.testing.assert_allclose(np.asarray(got), np.asarray(ref), atol=1e-4, rtol=0)


@pytest.mark.parametrize("exported", ["stablehlo"], indirect=True)  # jax.export's own format
def test_the_artifact_runs_with_jax_alone_in_a_fresh_process(exported):
    """Deserialized and run without jaxspeech (nor flax) imported: the program and the
    parameters are all in the file."""
    _, loaded, described, where, fmt, _ = exported
    audio, lengths = _audio(2, 20000, 5)
    np.save(where / "audio.npy", audio)
    np.save(where / "lengths.npy", lengths)
    script = (
        "import sys, json, numpy as np, jax\n"
        f"d = {str(where)!r}\n"
        "exp = jax.export.deserialize(open(d + '/ctc.stablehlo', 'rb').read())\n"
        "lp, n = exp.call(np.load(d + '/audio.npy'), np.load(d + '/lengths.npy'))\n"
        "np.save(d + '/out.npy', np.asarray(lp))\n"
        "print(json.dumps(sorted(m for m in ('jaxspeech', 'flax') if m in sys.modules)))\n"
    )
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    env.pop("XLA_FLAGS", None)  # one plain CPU device, as a deployment would have
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, cwd="/"
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == []
    want = np.asarray(loaded["ctc"](audio, lengths)[0])
    np.testing.assert_allclose(np.load(where / "out.npy"), want, atol=1e-5, rtol=0)


# ---------------------------------------------------------------- streaming
def _stream(loaded, info, audio: np.ndarray, lengths: np.ndarray, steps: int) -> list:
    """Streams through the exported stream functions: stream_first, `steps` stream_steps,
    stream_flush with each stream's rest -> [(B, N, .) per output..., (B, N) valid]."""
    n_out = len(info.outputs) + 1
    s1, s2 = info.first_samples, info.step_samples
    chunks = [loaded["stream_first"](audio[:, :s1])]
    for i in range(steps):
        state = chunks[-1][n_out:]
        chunks.append(loaded["stream_step"](*state, audio[:, s1 + i * s2 : s1 + (i + 1) * s2]))
    pos = s1 + steps * s2
    rest = np.zeros((len(audio), s2), np.float32)
    rest[:, : audio.shape[1] - pos] = audio[:, pos:]
    last = loaded["stream_flush"](*chunks[-1][n_out:], rest, (lengths - pos).astype(np.int32))
    chunks = [c[:n_out] for c in chunks] + [last]
    return [np.concatenate([np.asarray(c[i]) for c in chunks], axis=1) for i in range(n_out)]


def _full_outputs(model, audio, lengths) -> tuple[list, np.ndarray]:
    """The whole utterances through the model: [CTC log-probs, enc_proj], frame counts."""
    enc, enc_len = model(jnp.asarray(audio), jnp.asarray(lengths), train=False)
    outs = [jax.nn.log_softmax(model.ctc_logits(enc), -1), model.transducer.joiner.enc_proj(enc)]
    return [np.asarray(o) for o in outs], np.asarray(enc_len)


def _assert_streamed_equal_full(streamed, full, full_len):
    *outs, valid = streamed
    for i, t in enumerate(full_len):
        # The valid frames are exactly the full computation's frames, in order.
        assert valid[i].sum() == t and valid[i, :t].all(), (i, valid[i], t)
        for got, want in zip(outs, full, strict=True):
            np.testing.assert_allclose(got[i, :t], want[i, :t], atol=1e-4, rtol=0)


def test_stream_functions_equal_the_whole_utterance(exported):
    """Chunk by chunk through the artifact (3 streams ending at different points of the
    last chunk, one exactly at a step's end) = the masked full-sequence model on each
    whole utterance; a stream shorter than the first chunk is stream_flush_first alone."""
    (graphdef, params, stats, config), loaded, described, _, _, fns = exported
    info = fns["stream_first"].stream
    hop, factor = config.features.hop_length, config.model.conformer.subsampling_factor
    # Independent of the code: 7 frames of receptive field at x4, 1 frame of STFT lag.
    assert info.first_samples == hop * (factor * CHUNK + 7 - factor + 1)
    assert info.step_samples == hop * factor * CHUNK
    assert info.frames == CHUNK and info.history == LEFT_CHUNKS * CHUNK
    assert info.outputs == ("log_probs", "enc_proj")
    assert described["stream_step"]["inputs"][-1]["shape"] == ["b", str(info.step_samples)]
    model = nnx.merge(graphdef, params, stats)
    steps = 3
    base = info.first_samples + steps * info.step_samples
    lengths = np.array([base + 1234, base, base + info.step_samples - 1], np.int32)
    audio, _ = _audio(3, int(lengths.max()), 3)
    audio[np.arange(audio.shape[1])[None, :] >= lengths[:, None]] = 0.0
    full, full_len = _full_outputs(model, audio, lengths)
    _assert_streamed_equal_full(_stream(loaded, info, audio, lengths, steps), full, full_len)
    # Streams that end within the first chunk (one of them exactly at its end).
    lengths = np.array([info.first_samples // 3, info.first_samples], np.int32)
    audio, _ = _audio(2, info.first_samples, 4)
    audio[0, lengths[0] :] = 0.0
    full, full_len = _full_outputs(model, audio, lengths)
    streamed = loaded["stream_flush_first"](audio, lengths)
    _assert_streamed_equal_full([np.asarray(x) for x in streamed], full, full_len)


def test_stream_history_is_required_exactly_where_it_means_something():
    config = demo.get_config("tiny")
    export_lib.check_stream_history(config, None)  # full context: nothing to say
    with pytest.raises(export_lib.UserError, match="does not stream"):
        export_lib.check_stream_history(config, 16)
    conformer = config.model.conformer
    conformer.causal, conformer.chunk_size = True, CHUNK
    with pytest.raises(export_lib.UserError, match="--stream_history N"):
        export_lib.check_stream_history(config, None)  # left_chunks -1: unlimited
    export_lib.check_stream_history(config, 16)
    with pytest.raises(export_lib.UserError, match=">= 0"):
        export_lib.check_stream_history(config, -1)
    conformer.left_chunks = 2
    with pytest.raises(export_lib.UserError, match="left_chunks \\* chunk_size"):
        export_lib.check_stream_history(config, 16)


def _transcriber():
    import importlib.util

    spec = importlib.util.spec_from_file_location("transcribe_onnx", TRANSCRIBER)
    transcriber = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(transcriber)
    return transcriber


@pytest.mark.parametrize("exported", ["onnx"], indirect=True)  # the transcriber's format
def test_runtime_transcriber_streams_like_it_decodes_whole_utterances(exported):
    """examples/transcribe_onnx.py --streaming: chunk by chunk through the ONNX stream
    functions, CTC and transducer greedy = their whole-utterance greedy, which equals
    the training code's (the other transcriber test)."""
    from jaxspeech.data.tokenizer import Tokenizer

    _, _, described, where, _, fns = exported
    transcriber = _transcriber()
    Tokenizer(kind="char", vocab=["<blank>", "<unk>", *"abcdefghij"]).save(str(where / "tokenizer"))
    manifest = {
        "format": "onnx",
        "audio": {"sample_rate": RATE, "min_samples": 1600},
        "run": {"decoding": {"max_symbols_per_frame": 3}},
        "tokenizer": {"dir": "tokenizer"},
        "streaming": export_lib.stream_section(fns, RATE),
    }
    info = fns["stream_first"].stream
    sizes = [info.first_samples // 2, info.first_samples + 2 * info.step_samples + 999]
    rng = np.random.default_rng(8)
    utts = [(0.1 * rng.standard_normal(n)).astype(np.float32) for n in sizes]
    for head in ("ctc", "rnnt"):
        keep = {k: v for k, v in described.items() if head == "ctc" or k != "ctc"}
        (where / "manifest.json").write_text(json.dumps(manifest | {"functions": keep}))
        artifact = transcriber.Artifact(str(where))
        for audio in utts:
            partials = []
            got = artifact.stream_ids(audio, partials.append)
            assert got == artifact.transcribe_ids(audio), head
            calls = 4 if len(audio) > info.first_samples else 1  # first, 2 steps, flush
            assert partials[-1] == got and len(partials) == calls and got, (head, got)
            assert all(p == got[: len(p)] for p in partials)  # greedy only ever appends


# ---------------------------------------------------------------- ONNX graph and int8
def _onnx_run(model, feeds: dict) -> list:
    import onnxruntime as ort

    return ort.InferenceSession(model.SerializeToString()).run(None, feeds)


def test_einsum_rewrite_to_matmul_is_exact():
    """Every Einsum of an activation with a constant weight becomes a MatMul (reshapes
    around it where the weight has 3 axes); one of two activations stays an Einsum."""
    from onnx import TensorProto, helper, numpy_helper

    from jaxspeech.serving import onnx_convert

    rng = np.random.default_rng(0)
    w = {
        "w_dense": rng.standard_normal((6, 5)).astype(np.float32),  # abc,cd->abd
        "w_qkv": rng.standard_normal((6, 2, 3)).astype(np.float32),  # btd,dhk->bthk
        "w_out": rng.standard_normal((2, 3, 6)).astype(np.float32),  # bthk,hkd->btd
    }
    nodes = [
        helper.make_node("Einsum", ["x", "w_dense"], ["y1"], equation="abc,cd->abd"),
        helper.make_node("Einsum", ["x", "w_qkv"], ["q"], equation="btd,dhk->bthk"),
        helper.make_node("Einsum", ["q", "w_out"], ["y2"], equation="bthk,hkd->btd"),
        helper.make_node("Einsum", ["q", "q"], ["s"], equation="bthk,bshk->bhts"),
    ]
    f32 = TensorProto.FLOAT
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", f32, ["b", "t", 6])],
        [helper.make_tensor_value_info(n, f32, None) for n in ("y1", "y2", "s")],
        [numpy_helper.from_array(v, k) for k, v in w.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    x = rng.standard_normal((2, 7, 6)).astype(np.float32)
    want = _onnx_run(model, {"x": x})
    assert onnx_convert.einsum_to_matmul(model) == 3
    ops = [n.op_type for n in model.graph.node]
    assert ops.count("MatMul") == 3 and ops.count("Einsum") == 1
    assert {t.name for t in model.graph.initializer} >= {"w_dense__2d", "w_qkv__2d", "w_out__2d"}
    assert not {"w_dense", "w_qkv", "w_out"} & {t.name for t in model.graph.initializer}
    for g, r in zip(_onnx_run(model, {"x": x}), want, strict=True):
        np.testing.assert_allclose(g, r, atol=1e-5, rtol=1e-5)
    # numpy reference of one of them
    np.testing.assert_allclose(want[1], np.einsum("btd,dhk,hke->bte", x, w["w_qkv"], w["w_out"]),
                               atol=1e-4, rtol=1e-4)  # fmt: skip
    assert onnx_convert._einsum_operands("bthk,rhk->bhtr", 3) is None


def _calibration(n: int, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [
        (0.1 * rng.standard_normal(int(s))).astype(np.float32)
        for s in rng.uniform(0.3, 1.5, n) * RATE
    ]


@pytest.fixture(scope="module")
def quantized(tmp_path_factory):
    """The CTC + transducer model's ONNX artifact quantized with both methods:
    (float directory, described functions, {method: (directory, report)}, model parts)."""
    graphdef, params, stats, config = _model("ctc_rnnt")
    where = tmp_path_factory.mktemp("onnx_int8")
    arguments = build.model_arguments(config, VOCAB)
    described = export_lib.export_onnx(arguments, params, stats, RATE, str(where), onnx_converter())
    out = {}
    for method in quantize.METHODS:
        d = tmp_path_factory.mktemp(method)
        for fn in described.values():
            (d / fn["file"]).write_bytes((where / fn["file"]).read_bytes())
        fns = {k: dict(v) for k, v in described.items()}
        report = quantize.quantize_artifact(
            str(d), fns, _calibration(6, 0), method=method, percentile=99.0,
            min_samples=1600, max_samples=RATE,
            num_freqs=config.features.n_fft // 2 + 1, num_mels=config.features.num_mel_bins,
            calibration={"split": "noise"},
        )  # fmt: skip
        out[method] = (d, fns, report)
    return where, described, out, (graphdef, params, stats, config)


def test_int8_weights_are_per_channel_symmetric_and_the_front_end_stays_float(quantized):
    import onnx
    from onnx import numpy_helper

    where, described, out, _ = quantized
    d, fns, report = out["minmax"]
    assert (
        set(report["functions"]) == {"ctc", "encoder"}
        and fns["ctc"]["int8_file"] == "ctc.int8.onnx"
    )
    assert "joiner" in report["float32"] and "predictor_step" in report["float32"]
    floats = onnx.load(str(where / "ctc.onnx"))
    consts = {t.name: numpy_helper.to_array(t) for t in floats.graph.initializer}
    matmul_weights = [
        n.input[1] for n in floats.graph.node if n.op_type == "MatMul" and n.input[1] in consts
    ]
    mel = [w for w in matmul_weights if consts[w].shape == (257, 80)]
    assert len(mel) == 1  # the front end's filterbank
    weights = report["functions"]["ctc"]["weights"]
    # Every other constant MatMul weight is quantized: named <float name>_quantized.
    assert sorted(w.removesuffix("_quantized") for w in weights) == sorted(
        set(matmul_weights) - set(mel)
    )
    q_consts = {
        t.name: numpy_helper.to_array(t)
        for t in onnx.load(str(d / "ctc.int8.onnx")).graph.initializer
    }
    for name, entry in weights.items():
        w = consts[name.removesuffix("_quantized")]
        scale = np.asarray(entry["scale"])
        assert entry["dtype"] == "int8" and entry["axis"] == 1 and scale.shape == (w.shape[1],)
        assert not np.any(entry["zero_point"])
        # numpy reference: symmetric per output column, max |w| -> 127
        np.testing.assert_allclose(scale, np.abs(w).max(0) / 127.0, rtol=1e-5)
        q = q_consts[name]
        assert q.dtype == np.int8
        np.testing.assert_array_equal(q, np.clip(np.round(w / scale), -127, 127))
    acts = report["functions"]["ctc"]["activations"]
    assert acts and all(e["dtype"] == "uint8" and np.ndim(e["scale"]) == 0 for e in acts.values())


def test_int8_outputs_follow_float_and_percentile_clips_ranges(quantized):
    import onnxruntime as ort

    where, described, out, _ = quantized
    audio, lengths = _audio(2, 24000, 7)
    sess = lambda p: ort.InferenceSession(str(p))
    want = sess(where / "ctc.onnx").run(None, {"audio": audio, "audio_len": lengths})[0]
    probs = np.exp(want)
    for method, (d, _, _) in out.items():
        got = sess(d / "ctc.int8.onnx").run(None, {"audio": audio, "audio_len": lengths})[0]
        # Total variation between the frame distributions stays small.
        tv = 0.5 * np.abs(np.exp(got) - probs).sum(-1)
        assert tv.mean() < 0.05, (method, tv.mean())
    minmax = out["minmax"][2]["functions"]["encoder"]["activations"]
    pct = out["percentile"][2]["functions"]["encoder"]["activations"]
    assert minmax.keys() == pct.keys()
    ratio = np.array([pct[k]["scale"] / minmax[k]["scale"] for k in minmax])
    assert np.all(ratio <= 1 + 1e-6) and np.any(ratio < 0.9)  # the 99th percentile clips


def test_runtime_transcriber_runs_the_transducer_pieces(quantized, tmp_path):
    """examples/transcribe_onnx.py's greedy transducer search over the ONNX pieces = the
    evaluator's `rnnt_greedy`, and its CTC path = the CTC greedy ids."""
    from jaxspeech.data.tokenizer import Tokenizer

    where, described, _, (graphdef, params, stats, config) = quantized
    transcriber = _transcriber()
    Tokenizer(kind="char", vocab=["<blank>", "<unk>", *"abcdefghij"]).save(str(where / "tokenizer"))
    max_symbols = int(config.decoding.max_symbols_per_frame)
    manifest = {
        "format": "onnx",
        "functions": {k: v for k, v in described.items() if k != "ctc"},
        "audio": {"sample_rate": RATE, "min_samples": 1600},
        "run": {"decoding": {"max_symbols_per_frame": max_symbols}},
        "tokenizer": {"dir": "tokenizer"},
    }
    (where / "manifest.json").write_text(json.dumps(manifest))
    artifact = transcriber.Artifact(str(where))
    model = nnx.merge(graphdef, params, stats)
    audio, lengths = _audio(3, 20000, 11)
    enc, enc_len = model(jnp.asarray(audio), jnp.asarray(lengths), train=False)
    pred_init, pred_step, joint = model.transducer.decoder_fns()
    tokens, num = rnnt_decoding.rnnt_greedy(
        model.transducer.joiner.enc_proj(enc), enc_len, pred_init, pred_step, joint,
        blank_id=0, max_symbols_per_frame=max_symbols,
    )  # fmt: skip
    want = rnnt_decoding.to_lists(np.asarray(tokens), np.asarray(num))
    got = [artifact.transcribe_ids(a[:n]) for a, n in zip(audio, lengths, strict=True)]
    assert got == want
    manifest["functions"] = described
    (where / "manifest.json").write_text(json.dumps(manifest))
    ctc = transcriber.Artifact(str(where))
    ids = ctc_decoding.collapse(
        np.asarray(ctc_decoding.greedy_ids(model.ctc_logits(enc))), np.asarray(enc_len)
    )
    assert [ctc.transcribe_ids(a[:n]) for a, n in zip(audio, lengths, strict=True)] == ids
