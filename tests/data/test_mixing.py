"""Scheduled learning's mixed plan (jaxspeech.data.mixing): the closed-form stream
positions against a step-by-step count, proportions per phase, schedule errors, and a
bitwise resume of the Grain iterator mid-phase."""

import grain
import numpy as np
import pytest

from jaxspeech.data import mixing
from jaxspeech.data.pipeline import BatchPlan, make_bucket_spec

SPEC = make_bucket_spec((1.0, 2.0), batch_seconds=8.0, max_tokens_per_second=10, sample_rate=100)


def _plan(n: int, seed: int) -> BatchPlan:
    durations = np.random.default_rng(seed).uniform(0.2, 2.0, n)
    return BatchPlan(durations, SPEC, seed=seed, shuffle=True)


def _walk(phases, steps):
    """Reference: walk the steps one by one, counting each stream's batches."""
    out, counts, start = [], [0, 0], 0
    for step in range(steps):
        phase = next((p for p in phases if step < p.end), phases[-1])
        start = 0 if phase is phases[0] else phases[phases.index(phase) - 1].end
        n = step - start
        stream = mixing.LABELED if phase.labeled_every and n % phase.labeled_every == 0 else 1
        out.append((stream, counts[stream]))
        counts[stream] += 1
    return out


@pytest.mark.parametrize(
    "text", ["0.8:4,1.0:1", "10:0,25:3,40:1", "1.0:2", "7:5,13:0,30:2"], ids=str
)
def test_stream_positions_match_a_step_by_step_count(text):
    phases = mixing.parse_schedule(text, 30)
    got = [mixing.stream_position(phases, s) for s in range(45)]  # 15 past the end
    assert got == _walk(phases, 45)


def test_proportions_per_phase():
    phases = mixing.parse_schedule("0.5:4,0.8:0,1.0:1", 200)
    assert [p.end for p in phases] == [100, 160, 200]
    streams = [mixing.stream_position(phases, s)[0] for s in range(200)]
    assert streams[:100].count(mixing.LABELED) == 25  # 1 in 4
    assert streams[100:160].count(mixing.LABELED) == 0  # untranscribed only
    assert streams[160:].count(mixing.LABELED) == 40  # labeled only
    plan = mixing.MixedPlan(_plan(50, 1), _plan(80, 2), phases)
    assert plan.counts(200) == (65, 135)


@pytest.mark.parametrize(
    "text,match",
    [
        ("0.5:4", "cover all"),
        ("0.5:4,0.4:1", "must increase"),
        ("0.5-4,1.0:1", "END:LABELED_EVERY"),
        ("1.0:-1", "must be >= 0"),
        ("", "cover all"),
    ],
)
def test_schedule_errors(text, match):
    with pytest.raises(ValueError, match=match):
        mixing.parse_schedule(text, 100)


def test_streams_must_share_batch_shapes():
    other = BatchPlan(
        np.full(10, 1.0), make_bucket_spec((1.0,), 4.0, 10, 100), seed=0, shuffle=True
    )
    with pytest.raises(ValueError, match="one BucketSpec"):
        mixing.MixedPlan(_plan(20, 1), other, mixing.parse_schedule("1.0:2", 10))


def _load(tag):
    def load(planned):
        return {
            "tag": np.full(len(planned.indices), tag),
            "indices": np.asarray(planned.indices).copy(),
            "bucket": planned.bucket,
        }

    return load


def test_iterator_resumes_bitwise_mid_phase():
    """Grain's iterator state (a position in the mixed plan) restores the same batches,
    each from the stream and at the position the uninterrupted iterator gave."""
    phases = mixing.parse_schedule("0.5:3,1.0:1", 40)
    plan = mixing.MixedPlan(_plan(60, 1), _plan(90, 2), phases)
    seen = []

    def extra(stream, planned, out):
        seen.append(stream)
        out["teacher"] = np.full(len(planned.indices), 10 + stream)

    load = mixing.MixedLoad(_load(0), _load(1), extra)
    ds = grain.MapDataset.source(plan).map(load).to_iter_dataset()
    it = iter(ds)
    first = [next(it) for _ in range(13)]
    state = it.get_state()
    rest = [next(it) for _ in range(14)]
    resumed = iter(ds)
    resumed.set_state(state)
    again = [next(resumed) for _ in range(14)]
    for a, b in zip(rest, again):
        assert a["stream"] == b["stream"] and a["bucket"] == b["bucket"]
        np.testing.assert_array_equal(a["indices"], b["indices"])
        np.testing.assert_array_equal(a["teacher"], 10 + a["stream"])
    # each batch came from the stream and position the schedule names
    for step, batch in enumerate(first + rest):
        stream, index = mixing.stream_position(phases, step)
        assert batch["stream"] == stream and int(batch["tag"][0]) == stream
        np.testing.assert_array_equal(batch["indices"], plan.plans[stream][index].indices)
    assert set(seen) == {0, 1}
