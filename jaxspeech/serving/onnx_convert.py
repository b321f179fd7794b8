"""ONNX conversion, run by `jaxspeech.export --format onnx` in the converter's own
environment (`make install-onnx`: jax2onnx cannot share the main install, see the
Makefile): `python -m jaxspeech.serving.onnx_convert --input STAGE --output DIR`.

STAGE (written by `jaxspeech.serving.recognizer_export.stage_for_conversion`) holds
`model.json` (the model's `build_model` arguments, the sample rate, the functions to
convert) and `arrays.npz` (the parameters and feature statistics by path). Each function of
`jaxspeech.models.inference` becomes `DIR/<name>.onnx`, with the same symbolic batch and
length as the StableHLO artifact, and its parameters inside. The last stdout line is
JSON: name -> {"file", "inputs", "outputs", "seconds"}.

Imports the model code only (jax, flax, numpy, librosa), never the training stack.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from collections.abc import Callable

import jax
import numpy as np
from flax import nnx

from jaxspeech.models import inference, model_from_arguments

MODEL_JSON = "model.json"
ARRAYS = "arrays.npz"


def load_staged(stage: str):
    """STAGE -> (graphdef, params, model_vars, description): the abstract model of the
    staged arguments filled with the staged arrays, every path checked."""
    described, arrays = read_stage(stage)
    abstract = nnx.eval_shape(lambda: model_from_arguments(described["arguments"], nnx.Rngs(0)))
    graphdef, params, model_vars = nnx.split(abstract, nnx.Param, ...)
    params = staged_tree(arrays, "params", nnx.to_pure_dict(params))
    model_vars = staged_tree(arrays, "model_vars", nnx.to_pure_dict(model_vars))
    return graphdef, params, model_vars, described


def read_stage(stage: str) -> tuple[dict, dict[str, np.ndarray]]:
    """STAGE (`stage_arrays`'s) -> (MODEL_JSON's description, ARRAYS's arrays by
    "<part>/<path>"): what every converter starts from."""
    with open(os.path.join(stage, MODEL_JSON)) as f:
        described = json.load(f)
    with np.load(os.path.join(stage, ARRAYS)) as npz:
        arrays = dict(npz)
    return described, arrays


def staged_tree(arrays: dict[str, np.ndarray], part: str, tree: dict) -> dict:
    """The staged arrays of `part` laid out as `tree` (an abstract model's pure dict of
    shapes), every path and shape checked.

    Raises:
      ValueError: a path missing or unexpected, or an array of another shape.
    """
    want = inference.flat_arrays(tree)
    got = {k[len(part) + 1 :]: v for k, v in arrays.items() if k.startswith(part + "/")}
    if set(want) != set(got):
        raise ValueError(
            f"staged {part} do not match the model: missing {sorted(set(want) - set(got))}, "
            f"unexpected {sorted(set(got) - set(want))}"
        )
    for k, a in want.items():
        if tuple(a.shape) != got[k].shape:
            raise ValueError(f"staged {part} {k}: shape {got[k].shape}, model {a.shape}")
    return inference.unflatten_like(tree, got)


def _einsum_operands(equation: str, w_rank: int):
    """ "<batch><c>,<c><o>-><batch><o>" -> (batch, contracted, out) letter strings, or None
    for any other form (the weight's contracted axes lead, A's trail, in the same order)."""
    ins, _, out = equation.replace(" ", "").partition("->")
    a, _, w = ins.partition(",")
    if not out or len(w) != w_rank or len(set(a)) != len(a) or len(set(w)) != len(w):
        return None  # no explicit output, or a repeated letter (a trace or a diagonal)
    contracted = "".join(x for x in w if x in a and x not in out)
    n = len(contracted)
    if not n or w[:n] != contracted or a[-n:] != contracted:
        return None
    batch, w_out = a[:-n], w[n:]
    if out != batch + w_out or any(x in a for x in w_out):
        return None
    return batch, contracted, w_out


def einsum_to_matmul(model) -> int:
    """Rewrite every Einsum of an activation with a constant weight (a Dense layer; jax2onnx
    lowers `dot_general` to Einsum) as Reshape? -> MatMul -> Reshape? on the weight as a
    2-D matrix, in place; returns how many. The same arithmetic, but in the operator
    that onnxruntime fuses and optimizes, and that its int8 quantization handles
    (Einsum it leaves in float32)."""
    from onnx import helper, numpy_helper  # the converter environment's package

    graph = model.graph
    inits = {t.name: t for t in graph.initializer}
    nodes, added, count = [], {}, 0
    for node in graph.node:
        w = inits.get(node.input[1]) if node.op_type == "Einsum" else None
        eq = next((a.s.decode() for a in node.attribute if a.name == "equation"), "")
        parts = _einsum_operands(eq, len(w.dims)) if w is not None else None
        if parts is None:
            nodes.append(node)
            continue
        batch, contracted, w_out = parts
        array = numpy_helper.to_array(w)
        k = int(np.prod(array.shape[: len(contracted)]))
        out_dims = list(array.shape[len(contracted) :])
        name2d = f"{w.name}__2d"
        if name2d not in added:
            added[name2d] = numpy_helper.from_array(array.reshape(k, -1), name2d)
        x = node.input[0]
        if len(contracted) > 1:  # merge A's contracted axes into one
            shape = f"{node.name}__in_shape"
            added[shape] = numpy_helper.from_array(np.array([0] * len(batch) + [-1]), shape)
            nodes.append(helper.make_node("Reshape", [x, shape], [f"{x}__2d"]))
            x = f"{x}__2d"
        if len(out_dims) == 1:
            nodes.append(helper.make_node("MatMul", [x, name2d], list(node.output), node.name))
        else:  # split the product's last axis into the weight's output axes
            mm = f"{node.name}__mm"
            shape = f"{node.name}__out_shape"
            added[shape] = numpy_helper.from_array(np.array([0] * len(batch) + out_dims), shape)
            nodes.append(helper.make_node("MatMul", [x, name2d], [mm], node.name))
            nodes.append(helper.make_node("Reshape", [mm, shape], list(node.output)))
        count += 1
    used = {i for n in nodes for i in n.input} | _subgraph_inputs(nodes)
    kept = [t for t in graph.initializer if t.name in used]
    del graph.node[:]
    graph.node.extend(nodes)
    del graph.initializer[:]
    graph.initializer.extend(kept + list(added.values()))
    return count


def _subgraph_inputs(nodes) -> set[str]:
    """Names read inside Loop/Scan/If bodies (outer-scope initializers stay)."""
    names = set()
    for n in nodes:
        for a in n.attribute:
            for g in [a.g] if a.HasField("g") else list(a.graphs):
                names |= {i for m in g.node for i in m.input} | _subgraph_inputs(g.node)
    return names


def convert(stage: str, output: str) -> dict:
    """Convert every staged function to DIR/<name>.onnx; returns their descriptions."""
    from jax2onnx import to_onnx  # the converter environment's package

    graphdef, params, model_vars, described = load_staged(stage)
    fns = inference.inference_functions(
        graphdef, params, model_vars, stream_history=described.get("stream_history")
    )
    out = {}
    for name in described["functions"]:
        specs = inference.argument_specs(name, fns, described["sample_rate"])
        inputs, outputs = inference.io_names(name, fns)
        path = os.path.join(output, f"{name}.onnx")
        for old in (path, path + ".data"):  # onnx appends to an existing external-data file
            if os.path.exists(old):
                os.remove(old)
        t0 = time.perf_counter()
        to_onnx(
            fns[name],
            inputs=list(specs),
            input_names=inputs,
            output_names=outputs,
            model_name=name,
            return_mode="file",
            output_path=path,
        )
        rewritten = _rewrite_file(path)
        out[name] = {
            "file": os.path.basename(path),
            "einsum_to_matmul": rewritten,
            "inputs": inputs,
            "outputs": outputs,
            "seconds": round(time.perf_counter() - t0, 2),
        }
    return out


def stage_arrays(where: str, described: dict, trees: dict[str, dict]) -> None:
    """Write what a converter reads into `where`: `described` as MODEL_JSON and each of
    `trees` (host arrays) as ARRAYS entries "<part>/<path>"."""
    with open(os.path.join(where, MODEL_JSON), "w") as f:
        json.dump(described, f)
    arrays = {}
    for part, tree in trees.items():
        arrays |= {f"{part}/{k}": np.asarray(v) for k, v in inference.flat_arrays(tree).items()}
    np.savez(os.path.join(where, ARRAYS), **arrays)


def write_onnx(
    fn: Callable, specs: tuple, name: str, inputs: tuple, outputs: tuple, output: str
) -> dict:
    """jax2onnx's conversion of one function `fn` at `specs` -> DIR/<name>.onnx (Einsums as
    MatMuls, as the recognizer's): the synthesizer's and the vocoder's converters ->
    {"file", "einsum_to_matmul", "seconds"}."""
    import onnx  # noqa: PLC0415 (the converter environment's packages)
    from jax2onnx import to_onnx  # noqa: PLC0415

    path = os.path.join(output, f"{name}.onnx")
    for old in (path, path + ".data"):  # onnx appends to an existing external-data file
        if os.path.exists(old):
            os.remove(old)
    t0 = time.perf_counter()
    to_onnx(
        fn,
        inputs=list(specs),
        input_names=list(inputs),
        output_names=list(outputs),
        model_name=name,
        return_mode="file",
        output_path=path,
    )
    # jax2onnx puts large constants (Vocos's inverse-DFT basis, 1.6 MB) in an external-data
    # file; loading reads them in, and the model is saved back as one file without it.
    model = onnx.load(path)
    rewritten = einsum_to_matmul(model)
    if os.path.exists(path + ".data"):
        os.remove(path + ".data")
    onnx.save(model, path)  # these models' parameters stay far below protobuf's 2 GB
    seconds = round(time.perf_counter() - t0, 2)
    return {"file": os.path.basename(path), "einsum_to_matmul": rewritten, "seconds": seconds}


def _rewrite_file(path: str) -> int:
    """einsum_to_matmul on an ONNX file, saved back (external data past 1.5 GB, as the
    protobuf limit is 2 GB)."""
    import onnx  # the converter environment's package

    model = onnx.load(path)
    count = einsum_to_matmul(model)
    big = sum(np.prod(t.dims) * 4 for t in model.graph.initializer) > 1.5e9
    for old in (path, path + ".data"):
        if os.path.exists(old):
            os.remove(old)
    onnx.save(model, path, save_as_external_data=big, location=os.path.basename(path) + ".data")
    return count


def converter_main(
    convert_fn: Callable[[str, str], dict], doc: str, output_help: str, argv: list[str] | None
) -> None:
    """The command line every converter module shares (this one, `jaxspeech.tts.acoustic`,
    `jaxspeech.vocoder.generator`): `--input STAGE --output DIR` -> `convert_fn(STAGE, DIR)`,
    its report printed as JSON on the last stdout line (what `staging.run_converter`
    reads). `doc`: the module's docstring, whose first paragraph is the help's."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--input", required=True, help="Staging directory.")
    parser.add_argument("--output", required=True, help=output_help)
    args = parser.parse_args(argv)
    print(json.dumps(convert_fn(args.input, args.output)), flush=True)


def run_converter_process(main_fn: Callable[[], object]) -> None:
    """`python -m CONVERTER`'s body: trace on the CPU (one device is all a conversion
    needs), onnx_ir's warnings off (one per untyped intermediate shape value: thousands of
    lines), then `main_fn()`; exits with its status."""
    jax.config.update("jax_platforms", "cpu")
    logging.getLogger("onnx_ir").setLevel(logging.ERROR)
    sys.exit(main_fn())


def main(argv: list[str] | None = None) -> None:
    converter_main(convert, __doc__, "Directory for the .onnx files.", argv)


if __name__ == "__main__":
    run_converter_process(main)
