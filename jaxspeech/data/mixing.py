"""Scheduled learning: one stream of labeled batches and one of other batches (untranscribed
audio with a teacher's targets, or pseudo-labeled audio), mixed step by step by phase.

The schedule is a few phases; in each, a labeled batch comes every `labeled_every` steps
(1: labeled only; 0: the other stream only). Which stream a step reads, and which of that
stream's batches, is a pure function of the step (closed form per phase), so the mixed
plan is indexed by step like `BatchPlan`: Grain's iterator state (a position) resumes it
bit for bit, and every process reads the same stream at every step (both streams use one
`BucketSpec`, and each stream's plan gives every process the same bucket per batch), so
batch shapes agree across hosts. A whole batch comes from one stream: its loss is either
supervised or soft-target, never a mix of normalizations.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

from jaxspeech.data.pipeline import BatchPlan, LoadBatch, Pipeline, PlannedBatch

LABELED, OTHER = 0, 1


@dataclasses.dataclass(frozen=True)
class Phase:
    """Steps [previous phase's end, end): a labeled batch at the phase's steps 0,
    labeled_every, 2 labeled_every, ... (labeled_every 0: none)."""

    end: int
    labeled_every: int


def parse_schedule(text: str, num_steps: int) -> tuple[Phase, ...]:
    """`"0.8:4,1.0:1"` -> phases: until 80% of num_steps a labeled batch every 4 steps, then
    labeled only. An end with a decimal point is a fraction of num_steps, else a step
    count; ends must increase and the last must reach num_steps (steps past it, if a run
    is extended, stay in the last phase).

    Raises:
      ValueError: a malformed schedule, named.
    """
    phases, last = [], 0
    for part in (p.strip() for p in text.split(",") if p.strip()):
        try:
            end_s, every_s = (x.strip() for x in part.split(":"))
            end = round(float(end_s) * num_steps) if "." in end_s else int(end_s)
            every = int(every_s)
        except ValueError:
            raise ValueError(
                f"schedule phase {part!r} is not END:LABELED_EVERY (e.g. 0.8:4 or 1000:4)"
            ) from None
        if end <= last or every < 0:
            raise ValueError(
                f"schedule {text!r}: phase ends must increase ({end} after {last}) and "
                f"LABELED_EVERY must be >= 0 (got {every})"
            )
        phases.append(Phase(end, every))
        last = end
    if not phases or last < num_steps:
        raise ValueError(f"schedule {text!r} must cover all {num_steps} steps")
    return tuple(phases)


def _labeled_count(n: int, every: int) -> int:
    """Labeled batches among a phase's first n steps."""
    return 0 if every == 0 else math.ceil(n / every)


def stream_position(phases: tuple[Phase, ...], step: int) -> tuple[int, int]:
    """(stream, index of this step's batch within that stream's plan)."""
    labeled = other = start = 0
    for i, ph in enumerate(phases):
        if step < ph.end or i == len(phases) - 1:
            n = step - start
            before = _labeled_count(n, ph.labeled_every)
            if ph.labeled_every and n % ph.labeled_every == 0:
                return LABELED, labeled + before
            return OTHER, other + n - before
        length = ph.end - start
        labeled += _labeled_count(length, ph.labeled_every)
        other += length - _labeled_count(length, ph.labeled_every)
        start = ph.end
    raise AssertionError("unreachable: the last phase takes every later step")


class MixedPlan:
    """`plan[step]` = (stream, that stream's PlannedBatch): two BatchPlans by `phases`."""

    def __init__(self, labeled: BatchPlan, other: BatchPlan, phases: tuple[Phase, ...]):
        if labeled.spec != other.spec:
            raise ValueError("the two streams must share one BucketSpec (the batch shapes)")
        self.plans, self.phases, self.spec = (labeled, other), phases, labeled.spec

    def __len__(self) -> int:
        return len(self.plans[LABELED])  # "forever" (training plans repeat epochs)

    def __getitem__(self, step: int) -> tuple[int, PlannedBatch]:
        stream, index = stream_position(self.phases, step)
        return stream, self.plans[stream][index]

    def epoch_of(self, step: int) -> tuple[int, int]:
        """The labeled stream's (epoch, position) at `step`: data-fault budgets follow it."""
        return self.plans[LABELED].epoch_of(_labeled_before(self.phases, step))

    def padding_fraction(self, epoch: int = 0) -> float:
        return self.plans[LABELED].padding_fraction(epoch)

    def counts(self, stop: int) -> tuple[int, int]:
        """(labeled, other) batches among steps [0, stop)."""
        labeled = _labeled_before(self.phases, stop)
        return labeled, stop - labeled


def _labeled_before(phases: tuple[Phase, ...], step: int) -> int:
    """Labeled batches among steps [0, step)."""
    stream, index = stream_position(phases, step)
    return index if stream == LABELED else step - index


# fill(stream, planned, batch): adds the arrays a stream's batches carry beyond the loader's
# (a teacher's targets), in place, with the same keys and shapes for both streams.
Extra = Callable[[int, PlannedBatch, dict], None]


class MixedLoad:
    """Loads `MixedPlan` items with each stream's own `LoadBatch`; `extra` adds the arrays
    both streams must carry alike. Picklable when its parts are (Grain workers)."""

    def __init__(self, labeled: LoadBatch, other: LoadBatch, extra: Extra | None = None):
        self.loads, self.extra = (labeled, other), extra

    def __call__(self, item: tuple[int, PlannedBatch]) -> dict:
        stream, planned = item
        out = self.loads[stream](planned)
        if self.extra is not None:
            self.extra(stream, planned, out)
        out["stream"] = stream  # a host value (pipeline.HOST_KEYS): which stream this step read
        return out


@dataclasses.dataclass
class MixedPipeline(Pipeline):
    """A `Pipeline` whose plan and load are `MixedPlan` and `MixedLoad`; `parts` are the two
    streams' own pipelines (for describe()). `index` is the labeled split's."""

    parts: tuple[Pipeline, ...] = ()
    schedule: str = ""

    def describe(self) -> str:
        phases = ", ".join(f"until step {p.end} {_phase_text(p)}" for p in self.plan.phases)
        return (
            f"labeled: {self.parts[LABELED].describe()}\nother: "
            f"{self.parts[OTHER].describe()}\nschedule {self.schedule!r}: {phases}"
        )


def _phase_text(p: Phase) -> str:
    if p.labeled_every == 1:
        return "labeled only"
    if p.labeled_every == 0:
        return "the other stream only"
    return f"1 labeled batch in {p.labeled_every}"
