"""Collectives of compiled HLO text: what each one moves and how often it runs.

`parse_collectives` reads every all-reduce, all-gather, reduce-scatter, all-to-all and
collective-permute of `compiled.as_text()` (async `-start` forms counted once, `-done`
ignored): its result shapes and dtypes (tuples summed), its replica-group size (explicit
`{{0,1},{2,3}}`, iota `[a,b]<=[..]` and the `mesh['axis_0'=8,...] {'axis_0'}` form) and
how many times it runs per call of the module (while-loop bodies times their known trip
count). `ring_bytes` is what one device sends for an op with ring algorithms, S the op's
result bytes: all-reduce 2(n-1)/n S, all-gather (n-1)/n S, reduce-scatter (n-1) S,
all-to-all (n-1)/n S, collective-permute S. Pure functions of the text (no jax).
Used by benchmarks/scaling.py and benchmarks/sync.py.
"""

from __future__ import annotations

import math
import re
from collections import Counter

KINDS = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")

DTYPE_BYTES = {
    "pred": 1,
    "s2": 0.25,
    "u2": 0.25,
    "s4": 0.5,
    "u4": 0.5,
    "s8": 1,
    "u8": 1,
    "s16": 2,
    "u16": 2,
    "f16": 2,
    "bf16": 2,
    "s32": 4,
    "u32": 4,
    "f32": 4,
    "s64": 8,
    "u64": 8,
    "f64": 8,
    "c64": 8,
    "c128": 16,
    "token": 0,
}
_ARRAY = re.compile(r"\b([a-z][a-z0-9]*)\[([0-9,]*)\]")
_INSTR = re.compile(
    r"^\s*(?:ROOT\s+)?%?(?P<name>[\w.\-]+)\s*=\s*(?P<type>.*?)\s*"
    r"(?P<kind>all-reduce|all-gather|reduce-scatter|all-to-all|collective-permute)"
    r"(?P<start>-start)?\("
)
_COMPUTATION = re.compile(r"^(?P<entry>ENTRY\s+)?%?(?P<name>[\w.\-]+)\s*(\(.*\)\s*->.*)?\{\s*$")
_CALLEE = re.compile(
    r"\b(?P<attr>body|condition|calls|to_apply|true_computation|false_computation|"
    r"branch_computations)=(?P<value>\{[^}]*\}|%?[\w.\-]+)"
)
_TRIP = re.compile(r'"known_trip_count"\s*:\s*\{\s*"n"\s*:\s*"(\d+)"')


def dtype_bytes(dtype: str) -> float:
    """Bytes per element of an HLO element type (f8* and f4* types included)."""
    if dtype in DTYPE_BYTES:
        return DTYPE_BYTES[dtype]
    if dtype.startswith("f8"):
        return 1
    if dtype.startswith("f4"):
        return 0.5
    raise ValueError(f"unknown HLO element type {dtype!r}")


def parse_shapes(type_str: str) -> list[tuple[str, tuple[int, ...]]]:
    """Every array type in an HLO type string, e.g. "(f32[8,4]{1,0}, s32[])" ->
    [("f32", (8, 4)), ("s32", ())]. Layouts and tuple nesting are ignored."""
    return [
        (d, tuple(int(x) for x in dims.split(",") if x)) for d, dims in _ARRAY.findall(type_str)
    ]


def shapes_bytes(shapes: list[tuple[str, tuple[int, ...]]]) -> float:
    """Total bytes of `parse_shapes` arrays."""
    return float(sum(dtype_bytes(d) * math.prod(dims) for d, dims in shapes))


def _split_top_level(type_str: str) -> list[str]:
    """Top-level elements of a tuple type "(a, (b, c), d)" -> ["a", "(b, c)", "d"]; a
    non-tuple type is returned as its only element. /*index=N*/ comments are dropped."""
    s = re.sub(r"/\*.*?\*/", "", type_str).strip()
    if not s.startswith("("):
        return [s]
    parts, depth, cur = [], 0, ""
    for ch in s[1:-1]:
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur.strip())
            cur = ""
        else:
            cur += ch
    if cur.strip():
        parts.append(cur.strip())
    return parts


def _result_type(kind: str, is_start: bool, type_str: str) -> str:
    """The part of a result type that is the collective's output. Async starts return
    (operands, outputs[, contexts]) for all-gather and collective-permute; all-reduce-start
    returns its outputs directly."""
    if not is_start or kind == "all-reduce":
        return type_str
    parts = _split_top_level(type_str)
    return parts[1] if len(parts) >= 2 else type_str


def group_size(line: str, num_devices: int | None = None) -> int | None:
    """Devices per replica group of one collective instruction line, or None if it names
    none (collective-permute) or cannot be read. `replica_groups={}` means all devices."""
    m = re.search(r"replica_groups=mesh\[([^\]]*)\][^{]*\{([^}]*)\}", line)
    if m:  # mesh['axis_0'=4,'axis_1'=2][, device_ids=([2,4]T(1,0))] {'axis_0'} (sub-axes:
        # {'axis_0':(1)2}); the device order does not change the group size
        sizes = {k: int(v) for k, v in re.findall(r"'([^']+)'\s*=\s*(\d+)", m.group(1))}
        n = 1
        for name, sub in re.findall(r"'([^']+)'(?::\(\d+\)(\d+))?", m.group(2)):
            n *= int(sub) if sub else sizes[name]
        return n
    m = re.search(r"replica_groups=\[([\d,]+)\]<=\[", line)
    if m:  # iota form: [groups, size]<=[dims]T(perm)
        return int(m.group(1).split(",")[-1])
    m = re.search(r"replica_groups=\{(.*?)\}\}", line)
    if m:  # explicit: {{0,1},{2,3}}
        first = m.group(1).lstrip("{").split("}")[0]
        return len([x for x in first.split(",") if x.strip()])
    if re.search(r"replica_groups=\{\}", line):
        return num_devices
    return None


def _num_devices(hlo_text: str) -> int | None:
    m = re.search(r"num_partitions=(\d+)", hlo_text[:20000])
    r = re.search(r"replica_count=(\d+)", hlo_text[:20000])
    if m or r:
        return max(int(m.group(1)) if m else 1, 1) * max(int(r.group(1)) if r else 1, 1)
    return None


def _execution_counts(hlo_text: str) -> tuple[dict, dict, dict]:
    """(computation of each line index, executions per step of each computation, flags).

    Executions start at 1 for ENTRY and multiply by a while loop's known trip count for
    its body and condition; conditional branches inherit their caller's count and are
    flagged (only one branch runs). Without an ENTRY every computation counts once."""
    line_comp, calls, entry, current = {}, {}, None, None
    for i, line in enumerate(hlo_text.splitlines()):
        if not line.startswith((" ", "\t")):
            m = _COMPUTATION.match(line)
            if m:
                current = m.group("name")
                calls.setdefault(current, [])
                if m.group("entry"):
                    entry = current
                continue
            if line.strip() == "}":
                current = None
                continue
        if current is None:
            continue
        line_comp[i] = current
        trip = _TRIP.search(line)
        for cm in _CALLEE.finditer(line):
            attr, value = cm.group("attr"), cm.group("value")
            for callee in re.findall(r"%?([\w.\-]+)", value.strip("{}")):
                mult, flag = 1, None
                if attr in ("body", "condition"):
                    mult = int(trip.group(1)) if trip else 1
                    flag = None if trip else "while_unknown_trips"
                elif attr in ("true_computation", "false_computation", "branch_computations"):
                    flag = "conditional_branch"
                calls[current].append((callee, mult, flag))
    counts: dict = {}
    flags: dict = {}
    if entry is None:
        return line_comp, {c: 1 for c in calls}, flags

    def visit(comp: str, count: int, inherited: tuple) -> None:
        counts[comp] = counts.get(comp, 0) + count
        flags.setdefault(comp, set()).update(inherited)
        for callee, mult, flag in calls.get(comp, []):
            if callee in calls:
                visit(callee, count * mult, inherited + ((flag,) if flag else ()))

    visit(entry, 1, ())
    return line_comp, counts, flags


def parse_collectives(hlo_text: str) -> list[dict]:
    """Every collective of an HLO module's text, one dict per instruction:
    name, kind (all-reduce | all-gather | reduce-scatter | all-to-all | collective-permute),
    async (a -start form), shapes [(dtype, dims)] of its output, bytes (their total),
    group_size (devices per replica group; None for collective-permute), computation,
    executions (times it runs per call of the module: while-loop trip counts multiplied
    in) and flags (conditional_branch, while_unknown_trips: counts that are bounds)."""
    num_devices = _num_devices(hlo_text)
    line_comp, counts, comp_flags = _execution_counts(hlo_text)
    ops = []
    for i, line in enumerate(hlo_text.splitlines()):
        m = _INSTR.match(line)
        if not m:
            continue
        kind, is_start = m.group("kind"), bool(m.group("start"))
        shapes = parse_shapes(_result_type(kind, is_start, m.group("type")))
        comp = line_comp.get(i)
        ops.append(
            {
                "name": m.group("name"),
                "kind": kind,
                "async": is_start,
                "shapes": shapes,
                "bytes": shapes_bytes(shapes),
                "group_size": None
                if kind == "collective-permute"
                else group_size(line, num_devices),
                "computation": comp,
                "executions": counts.get(comp, 1),
                "flags": sorted(comp_flags.get(comp, ())),
            }
        )
    return ops


def ring_bytes(op: dict) -> float:
    """Bytes one device sends for one execution of `op` with a ring algorithm
    (S = the op's output bytes, n = its group size)."""
    s, kind = op["bytes"], op["kind"]
    if kind == "collective-permute":
        return s
    n = op["group_size"]
    if n is None:
        raise ValueError(f"{op['name']}: no replica group size")
    if n <= 1:
        return 0.0
    if kind == "all-reduce":
        return 2 * (n - 1) / n * s
    if kind in ("all-gather", "all-to-all"):
        return (n - 1) / n * s
    if kind == "reduce-scatter":
        return (n - 1) * s
    raise ValueError(f"unknown collective kind {kind!r}")


def summarize(ops: list[dict]) -> dict:
    """Counts (instructions and executions) and bytes per device per step, by kind and by
    group size; every op's executions multiply its ring bytes."""
    out = {
        "ops": dict(Counter(o["kind"] for o in ops)),
        "executions": {},
        "bytes_by_kind": {},
        "bytes_by_group_size": {},
        "flagged_ops": sum(1 for o in ops if o["flags"]),
    }
    for o in ops:
        b = ring_bytes(o) * o["executions"]
        out["executions"][o["kind"]] = out["executions"].get(o["kind"], 0) + o["executions"]
        out["bytes_by_kind"][o["kind"]] = out["bytes_by_kind"].get(o["kind"], 0.0) + b
        key = str(o["group_size"])
        out["bytes_by_group_size"][key] = out["bytes_by_group_size"].get(key, 0.0) + b
    out["bytes"] = sum(out["bytes_by_kind"].values())
    return out


def gradient_accounting(ops: list[dict], param_shapes: list[tuple[str, tuple]]) -> dict:
    """Splits the arrays that all-reduces carry into parameter-shaped ones (each parameter
    matched at most once; dims compared sorted, so a transposed layout matches) and the
    rest. Bytes are array bytes per step (executions multiplied), not ring bytes. In a
    data-parallel step the parameter-shaped ones are the gradients; `missing` lists
    parameters no all-reduced array matched (their gradients were reduced in another
    form), `other` the largest unmatched arrays."""
    left = Counter((d, tuple(sorted(s))) for d, s in param_shapes)
    matched, other = 0.0, Counter()
    for o in ops:
        if o["kind"] != "all-reduce":
            continue
        for d, dims in o["shapes"]:
            nbytes = dtype_bytes(d) * math.prod(dims) * o["executions"]
            key = (d, tuple(sorted(dims)))
            if left[key] > 0:
                left[key] -= 1
                matched += nbytes
            else:
                other[f"{d}{list(dims)}"] += nbytes
    param_bytes = float(sum(dtype_bytes(d) * math.prod(s) for d, s in param_shapes))
    missing = Counter()
    for (d, dims), k in left.items():
        if k > 0:
            missing[f"{d}{list(dims)}"] += k
    return {
        "param_bytes": param_bytes,
        "param_shaped_bytes": matched,
        "other_bytes": float(sum(other.values())),
        "other": [[name, b] for name, b in other.most_common(6)],
        "missing": [[name, k] for name, k in missing.most_common(6)],
    }


def hlo_dtype(dtype: object) -> str:
    """numpy/JAX dtype -> HLO element type name (float32 -> f32, int8 -> s8)."""
    name = str(dtype)
    for np_prefix, hlo_prefix in (("float", "f"), ("bfloat", "bf"), ("uint", "u"), ("int", "s")):
        if name.startswith(np_prefix) and name[len(np_prefix) :].isdigit():
            return hlo_prefix + name[len(np_prefix) :]
    return {"bool": "pred", "complex64": "c64", "complex128": "c128"}.get(name, name)
