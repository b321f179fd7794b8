"""Kernel launches of optimized GPU HLO text: launches per step, loops, custom calls.

What launches: after XLA:GPU's passes every op that does device work is a fusion (single
ops are wrapped in fusions too), a custom call (cuBLAS, cuDNN, Triton, Mosaic GPU), a
copy / copy-start, a collective (its -start form), or an unfused op such as sort: each is
one launch (a copy-start or collective is a DMA or NCCL launch rather than a kernel, and
a launch all the same). No work: parameter, constant (in device memory at load),
tuple, get-tuple-element, bitcast, the scheduling ops (after-all, add-dependency,
opt-barrier, domain) and the -done halves of async pairs. Control flow launches what it
runs: a while loop its body's launches times its known_trip_count (XLA's while thunk
runs a known count without evaluating the condition; with no known count, body and
condition are counted once and the loop flagged), a conditional its largest branch (an
upper bound, flagged), a call or async-start its computation's launches. A fusion's own
computation and the scalar computations of reduce, sort, scatter etc. are inside one
kernel and never counted. Without autotuning or command buffers these are upper bounds
of what a GPU profile shows; compare them as ratios. Pure functions of
`compiled.as_text()` (no jax), sharing benchmarks/lib/hlo.py's reading of the text. Used
by benchmarks/gpu_plan.py.
"""

from __future__ import annotations

import math
import re
from collections import Counter

from benchmarks.lib.hlo import _CALLEE, _COMPUTATION, _TRIP, _split_top_level, parse_shapes

_NO_WORK = frozenset(
    {
        "parameter",
        "constant",
        "tuple",
        "get-tuple-element",
        "bitcast",
        "after-all",
        "add-dependency",
        "opt-barrier",
        "domain",
        "async-update",
    }
)
_DEF = re.compile(r"^\s*(?:ROOT\s+)?%?(?P<name>[\w.\-]+)\s*=\s*(?P<rest>.*)$")
_OPCODE = re.compile(r"\s*(?P<op>[a-z][\w\-]*)\(")
_TARGET = re.compile(r'custom_call_target="(?P<target>[^"]+)"')
_FUSION_KIND = re.compile(r'"fusion_backend_config"\s*:\s*\{\s*"kind"\s*:\s*"(?P<kind>[^"]+)"')
_OP_NAME = re.compile(r'op_name="(?P<op_name>[^"]*)"')
_LHS_CONTRACTING = re.compile(r'"lhs_contracting_dimensions"\s*:\s*\[(?P<dims>[^\]]*)\]')
CUSTOM_CALL_FAMILIES = (  # (family, target prefixes), first match wins
    ("cublas", ("__cublas$",)),
    ("cudnn", ("__cudnn$",)),
    ("triton", ("__gpu$xla.gpu.triton", "__triton")),
    ("mosaic_gpu", ("mosaic_gpu",)),
)


def _skip_type(rest: str) -> tuple[str, str]:
    """Splits "TYPE opcode(...)..." after an instruction's `=` into (TYPE, the remainder);
    TYPE is an array type or a (possibly nested) tuple type."""
    rest = rest.lstrip()
    if not rest.startswith("("):
        type_str, _, tail = rest.partition(" ")
        return type_str, tail
    depth = 0
    for i, ch in enumerate(rest):
        depth += ch == "("
        depth -= ch == ")"
        if depth == 0:
            return rest[: i + 1], rest[i + 1 :]
    return rest, ""


def parse_computations(hlo_text: str) -> tuple[dict[str, list[dict]], str | None]:
    """The computations of an HLO module's text, {name: [instruction, ...]}, and the ENTRY
    computation's name (None if the text has none). An instruction is a dict: name,
    opcode, type (its result type string), line (the whole text line)."""
    comps: dict[str, list[dict]] = {}
    entry, current = None, None
    for line in hlo_text.splitlines():
        if not line.startswith((" ", "\t")):
            m = _COMPUTATION.match(line)
            if m:
                current = m.group("name")
                comps[current] = []
                entry = current if m.group("entry") else entry
            elif line.strip() == "}":
                current = None
            continue
        m = _DEF.match(line) if current is not None else None
        if not m:
            continue
        type_str, tail = _skip_type(m.group("rest"))
        op = _OPCODE.match(tail)
        if op:
            comps[current].append(
                {"name": m.group("name"), "opcode": op.group("op"), "type": type_str, "line": line}
            )
    return comps, entry


def _callees(line: str, attrs: tuple[str, ...]) -> list[str]:
    """Computations an instruction line names in any of `attrs` (e.g. body, calls)."""
    out = []
    for cm in _CALLEE.finditer(line):
        if cm.group("attr") in attrs:
            out += re.findall(r"%?([\w.\-]+)", cm.group("value").strip("{}"))
    return out


def trip_count(line: str) -> int | None:
    """A while instruction's known_trip_count (from its backend_config), else None."""
    m = _TRIP.search(line)
    return int(m.group(1)) if m else None


def _operands(line: str, opcode: str) -> list[str]:
    """The operand names of an instruction line (`opcode(%a, %b.1)` -> ["a", "b.1"])."""
    start = line.find(f" {opcode}(")
    if start < 0:
        return []
    depth, args = 0, ""
    for ch in line[start + len(opcode) + 1 :]:
        depth += ch in "([{"
        depth -= ch in ")]}"
        if depth == 0:
            break
        args += ch
    return re.findall(r"%([\w.\-]+)", args)


def gemm_flops(ins: dict, types: dict[str, str]) -> float:
    """FLOPs of one cuBLAS GEMM custom call: 2 x output elements x contracted size, from its
    result type, its first operand's type (`types`: name -> type string of the
    computation's instructions) and the dot dimension numbers of its backend_config. 0 when
    any of them cannot be read."""
    out = parse_shapes(_split_top_level(ins["type"])[0])
    ops = _operands(ins["line"], ins["opcode"])
    m = _LHS_CONTRACTING.search(ins["line"])
    if not out or not ops or ops[0] not in types or not m:
        return 0.0
    lhs = parse_shapes(types[ops[0]])
    if not lhs:
        return 0.0
    dims = lhs[0][1]
    contracted = math.prod(dims[int(d)] for d in re.findall(r"\d+", m.group("dims")))
    return 2.0 * math.prod(out[0][1]) * contracted


def custom_call_family(target: str) -> str:
    """cublas | cudnn | triton | mosaic_gpu | other, from a custom_call_target."""
    for family, prefixes in CUSTOM_CALL_FAMILIES:
        if target.startswith(prefixes):
            return family
    return "other"


_BRANCHES = ("true_computation", "false_computation", "branch_computations")


class _Launches:
    """The tallies of one module: `per_call` (launches of one call of a computation) and
    `walk` (every launching instruction reached from ENTRY, with its executions)."""

    def __init__(self, comps: dict[str, list[dict]], long_loop_trips: int):
        self.comps, self.long_loop_trips = comps, long_loop_trips
        self.memo: dict[str, int] = {}
        self.out = {
            "launches": 0,
            "by_opcode": Counter(),
            "custom_calls": Counter(),
            "custom_call_instructions": Counter(),
            "custom_fusions": Counter(),
            "gemm_flops": 0.0,
            "loops": [],
            "long_loop_launches": 0,
            "flags": set(),
        }

    def per_call(self, comp: str, stack: tuple = ()) -> int:
        """Launches of one call of `comp` (memoized; no tallies)."""
        if comp not in self.memo:
            if comp in stack or comp not in self.comps:
                return 0
            stack = stack + (comp,)
            self.memo[comp] = sum(self.instr_launches(i, stack) for i in self.comps[comp])
        return self.memo[comp]

    def instr_launches(self, ins: dict, stack: tuple) -> int:
        """Launches of one execution of instruction `ins`."""
        op, line = ins["opcode"], ins["line"]
        if op in _NO_WORK or op.endswith("-done"):
            return 0
        if op == "while":
            body = sum(self.per_call(c, stack) for c in _callees(line, ("body",)))
            trips = trip_count(line)
            if trips is None:
                cond = _callees(line, ("condition",))
                return body + sum(self.per_call(c, stack) for c in cond)
            return trips * body
        if op == "conditional":
            return max((self.per_call(c, stack) for c in _callees(line, _BRANCHES)), default=0)
        if op in ("call", "async-start"):
            called = _callees(line, ("to_apply", "calls"))
            return sum(self.per_call(c, stack) for c in called) if called else 1
        return 1

    def walk(self, comp: str, mult: int, depth: int, in_long: bool, stack: tuple) -> None:
        """Adds `mult` calls of `comp` to the tallies, recursing into control flow."""
        if comp in stack or comp not in self.comps:
            return
        stack = stack + (comp,)
        types = {ins["name"]: ins["type"] for ins in self.comps[comp]}
        for ins in self.comps[comp]:
            op, line = ins["opcode"], ins["line"]
            if op in _NO_WORK or op.endswith("-done"):
                continue
            if op == "while":
                self.walk_loop(ins, comp, mult, depth, in_long, stack)
            elif op == "conditional":
                self.out["flags"].add("conditional_largest_branch")
                branches = _callees(line, _BRANCHES)
                if branches:
                    largest = max(branches, key=lambda c: self.per_call(c, stack))
                    self.walk(largest, mult, depth, in_long, stack)
            elif op in ("call", "async-start") and _callees(line, ("to_apply", "calls")):
                for c in _callees(line, ("to_apply", "calls")):
                    self.walk(c, mult, depth, in_long, stack)
            else:
                self.tally_kernel(ins, mult, types)

    def walk_loop(
        self, ins: dict, comp: str, mult: int, depth: int, in_long: bool, stack: tuple
    ) -> None:
        """A while loop executed `mult` times: its record, then its body (x trips)."""
        line, out = ins["line"], self.out
        trips = trip_count(line)
        if trips is None:
            out["flags"].add("while_unknown_trips")
        per_trip = self.instr_launches(ins, stack) // (trips or 1)
        long = trips is not None and trips >= self.long_loop_trips
        if long and not in_long:
            out["long_loop_launches"] += mult * trips * per_trip
        name = _OP_NAME.search(line)
        out["loops"].append(
            {
                "name": ins["name"],
                "computation": comp,
                "trip_count": trips,
                "kernels_per_trip": per_trip,
                "executions": mult,
                "launches": mult * (trips or 1) * per_trip,
                "depth": depth,
                "op_name": name.group("op_name") if name else "",
            }
        )
        inner = ("body", "condition") if trips is None else ("body",)
        for c in _callees(line, inner):
            self.walk(c, mult * (trips or 1), depth + 1, in_long or long, stack)

    def tally_kernel(self, ins: dict, mult: int, types: dict[str, str]) -> None:
        """One launching instruction executed `mult` times."""
        op, line, out = ins["opcode"], ins["line"], self.out
        out["by_opcode"][op] += mult
        if op == "custom-call":
            t = _TARGET.search(line)
            target = t.group("target") if t else "?"
            out["custom_calls"][target] += mult
            if custom_call_family(target) == "cublas":
                out["gemm_flops"] += mult * gemm_flops(ins, types)
        elif op == "fusion":
            k = _FUSION_KIND.search(line)
            if k:
                out["custom_fusions"][k.group("kind")] += mult


def count_launches(hlo_text: str, long_loop_trips: int = 100) -> dict:
    """Kernel launches of one call of an optimized GPU HLO module (rules above).

    Returns launches (per call of the module), by_opcode {opcode: launches},
    custom_calls {target: launches}, custom_call_instructions {target: instructions in the
    text}, custom_fusions {backend kind: launches} (fusions XLA emits by a custom backend,
    e.g. Triton GEMMs), gemm_flops (FLOPs of the cuBLAS GEMMs per call: matmuls that
    rematerialization recomputes show here), loops (one dict per while instruction reached
    from ENTRY: name, computation, trip_count (None: unknown), kernels_per_trip (its body's
    launches, nested loops multiplied in), executions (times the loop starts per call),
    launches (all its trips), depth (0: not inside another loop), op_name (its metadata,
    what jax op made it)), long_loop_launches (launches inside loops of >=
    `long_loop_trips` trips, each counted once however such loops nest) and flags
    (reasons a figure is a bound)."""
    comps, entry = parse_computations(hlo_text)
    if entry is None:
        raise ValueError("the HLO text has no ENTRY computation")
    tally = _Launches(comps, long_loop_trips)
    out = tally.out
    for instrs in comps.values():  # static counts: every custom call in the text
        for ins in instrs:
            if ins["opcode"] == "custom-call":
                t = _TARGET.search(ins["line"])
                out["custom_call_instructions"][t.group("target") if t else "?"] += 1
    tally.walk(entry, 1, 0, False, ())
    out["launches"] = tally.per_call(entry)
    for key in ("by_opcode", "custom_calls", "custom_call_instructions", "custom_fusions"):
        out[key] = dict(out[key].most_common())
    out["flags"] = sorted(out["flags"])
    return out


def loop_summary(counts: dict, min_trips: int = 100, max_kernels: int = 2) -> dict:
    """Of `count_launches`' loops: per_frame_loops (>= `min_trips` trips with more than
    `max_kernels` kernels a trip: the loops the plan's goal allows none of), their
    launches, and the largest loops by launches (up to 6)."""
    per_frame = [
        lp
        for lp in counts["loops"]
        if (lp["trip_count"] or 0) >= min_trips and lp["kernels_per_trip"] > max_kernels
    ]
    return {
        "per_frame_loops": len(per_frame),
        "per_frame_loop_launches": sum(lp["launches"] for lp in per_frame),
        "largest": sorted(counts["loops"], key=lambda lp: -lp["launches"])[:6],
    }


def custom_call_families(custom_calls: dict) -> dict:
    """{target: n} -> {family: n} (cublas, cudnn, triton, mosaic_gpu, other)."""
    out: Counter = Counter()
    for target, n in custom_calls.items():
        out[custom_call_family(target)] += n
    return dict(out.most_common())
