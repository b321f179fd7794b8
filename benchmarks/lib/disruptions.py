"""The disruptions of a chaos run: their kinds, when each strikes, and whether it fires.

D disruptions, their kinds drawn from a seed (with D >= 3 at least one of each; always at
least one kill during a save); the step of disruption i of D is drawn from the i-th of D
equal slices of steps 1..S-1, moved past the step the run resumed from. Used by
benchmarks/chaos.py.
"""

from __future__ import annotations

import random

KINDS = ("sigkill_step", "sigkill_save", "sigterm_step")


def fires(
    trigger: tuple[str, int] | list | None,
    *,
    progress: int | None = None,
    saved: int | None = None,
) -> bool:
    """Whether a progress line of step `progress`, or a `checkpoint_saved` event of step
    `saved`, is the moment of this run's disruption."""
    if not trigger:
        return False
    kind, step = trigger
    if kind == "sigkill_save":
        return saved is not None and saved == step
    return progress is not None and progress == step


def plan_kinds(disruptions: int, seed: int) -> list[str]:
    """The kinds of the D disruptions, in order: at least one `sigkill_save`; with
    D >= 3 at least one of each kind; the rest drawn uniformly; shuffled by `seed`."""
    rng = random.Random(seed)
    if disruptions <= 0:
        return []
    base = list(KINDS) if disruptions >= 3 else ["sigkill_save"]
    kinds = base + [rng.choice(KINDS) for _ in range(disruptions - len(base))]
    rng.shuffle(kinds)
    return kinds


def window(index: int, total: int, start: int, steps: int) -> tuple[int, int] | None:
    """Steps lo..hi where disruption `index` of `total` may strike a run that starts at
    `start`: the index-th of `total` equal slices of 1..S-1, moved past `start` (at
    least one step past it, never S); None when no step is left before S."""
    lo = max(start + 1, index * (steps - 1) // total + 1)
    hi = min(steps - 1, max(lo, (index + 1) * (steps - 1) // total))
    return (lo, hi) if lo <= hi else None


def choose_trigger(
    kind: str,
    start: int,
    steps: int,
    every: int,
    index: int,
    total: int,
    rng: random.Random,
) -> tuple[str, int] | None:
    """(kind, step) of disruption `index` of `total` for a run that starts at `start`;
    None when no step is left before S.

    The step is drawn uniformly from `window(...)`, so disruptions spread over the whole
    run and each run gets past the step it resumed from. `sigkill_save` takes the first
    save of the schedule (a multiple of C) from the window's start on, and falls back to
    `sigkill_step` when none is left before step S."""
    span = window(index, total, start, steps)
    if span is None:
        return None
    k = rng.randint(*span)
    if kind == "sigkill_save":
        saves = [n for n in range(span[0], steps) if every and n % every == 0]
        return (kind, saves[0]) if saves else ("sigkill_step", k)
    return kind, k
