"""train_step's rows of both frameworks: ours and the PyTorch peer's (`--peer`) in one
table, each peer row right after ours of the same model, and the ours / peer comparison.

A row is a dict with model, framework ("jaxspeech" or "pytorch"; absent means ours),
device, dtype, params_m, batch, seconds, step_ms, audio_s_per_s and what else each
framework measures (None where it has no figure: the peer has no compile step, no model
FLOP count and no XLA memory plan).
"""

from __future__ import annotations

OURS, PEER = "jaxspeech", "pytorch"


def framework(row: dict) -> str:
    return row.get("framework", OURS)


def interleave(ours: list[dict], peers: list[dict]) -> list[dict]:
    """Ours in order, each followed by the peer rows of its model and dtype; peer rows of a
    model ours has no row for (it did not fit) come last, in their order."""
    out, placed = [], set()
    for r in ours:
        out.append(r)
        for i, p in enumerate(peers):
            if (p["model"], p["dtype"]) == (r["model"], r["dtype"]):
                out.append(p)
                placed.add(i)
    return out + [p for i, p in enumerate(peers) if i not in placed]


def _fmt(x: float | None, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def table_lines(rows: list[dict]) -> list[str]:
    """The markdown table of the rows."""
    lines = [
        "| model | framework | device | dtype | params M | B x S | step ms | audio s/s "
        "| model GFLOP/step | achieved TFLOP/s | peak TFLOP/s | MFU | compile s "
        "| XLA args / temp MiB | peak in use MiB |",
        "|" + "---|" * 15,
    ]
    for r in rows:
        lines.append(
            f"| {r['model']} | {framework(r)} | {r['device']} | {r['dtype']} "
            f"| {r['params_m']:.1f} | {r['batch']} x {r['seconds']:g} s | {r['step_ms']:.0f} "
            f"| {r['audio_s_per_s']:.1f} | {_fmt(r.get('model_gflop_per_step'), '.1f')} "
            f"| {_fmt(r.get('achieved_tflops'), '.3f')} | {_fmt(r.get('peak_tflops'), '.3f')} "
            f"| {_fmt(r.get('mfu'), '.1%')} | {_fmt(r.get('compile_s'), '.1f')} "
            f"| {_fmt(r.get('xla_argument_mib'), '.0f')} / {_fmt(r.get('xla_temp_mib'), '.0f')} "
            f"| {_fmt(r.get('peak_bytes_in_use_mib'), '.0f')} |"
        )
    return lines


def comparison_lines(rows: list[dict]) -> list[str]:
    """One line per model and dtype measured both ways: step, audio s/s, parameters and
    peak memory of each, and ours / the peer's audio s/s (above 1: ours is faster)."""
    lines = []
    for p in (r for r in rows if framework(r) == PEER):
        key = (p["model"], p["dtype"])
        ours = next(
            (r for r in rows if framework(r) == OURS and (r["model"], r["dtype"]) == key), None
        )
        if ours is None:
            continue
        same_batch = (ours["batch"], ours["seconds"]) == (p["batch"], p["seconds"])
        lines.append(
            f"{p['model']} {p['dtype']}: jaxspeech {ours['step_ms']:.0f} ms, "
            f"{ours['audio_s_per_s']:.1f} audio s/s, {ours['params_m']:.1f} M params"
            f"{_peak(ours)} | PyTorch peer {p['step_ms']:.0f} ms, {p['audio_s_per_s']:.1f} "
            f"audio s/s, {p['params_m']:.1f} M params{_peak(p)} | ours / peer: "
            f"{ours['audio_s_per_s'] / p['audio_s_per_s']:.2f}x"
            + ("" if same_batch else " (different batches)")
        )
    return lines


def _peak(row: dict) -> str:
    mib = row.get("peak_bytes_in_use_mib")
    return "" if mib is None else f", peak {mib / 1024:.1f} GiB"
