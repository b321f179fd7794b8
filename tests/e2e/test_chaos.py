"""benchmarks/chaos.py --quick: train on a corpus with damaged records through a SIGKILL at
a step, a SIGTERM and a SIGKILL during an asynchronous save; the resumed run must end bit
for bit where an uninterrupted one does, having read the same utterances at every step and
skipped the same unreadable records."""

import importlib.util
import json
import os

import pytest

from benchmarks.lib import disruptions, trainer_process
from jaxspeech.runs import events as run_events
from tests.e2e.cli import QUICK_COMPILE_FLAGS, session_overrides

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_spec = importlib.util.spec_from_file_location(
    "chaos_benchmark", os.path.join(ROOT, "benchmarks", "chaos.py")
)
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)
pytestmark = pytest.mark.slow


def _around(events: list[dict], step: int) -> list[dict]:
    """The events of `step` from its (preemption) save to the run's `preempted` event (the
    previous save's commit may land between them)."""
    i = next(i for i, x in enumerate(events) if x["event"] == "preempted" and x["step"] == step)
    saved = [x for x in events[: i + 1] if x["event"] == "checkpoint_saved"][-1]
    assert saved["reason"] == "preemption", saved
    return [x for x in events[events.index(saved) : i + 1] if x.get("step") == step]


def test_quick_chaos_resumes_exactly(corpus, tmp_path, monkeypatch):
    _, shards = corpus
    monkeypatch.setattr(trainer_process, "XLA_FLAGS", QUICK_COMPILE_FLAGS)
    out = tmp_path / "chaos.json"
    r = bench.run_chaos(
        steps=bench.QUICK["steps"],
        disruptions=bench.QUICK["disruptions"],
        seed=0,
        data=str(shards),
        workdir=str(tmp_path / "runs"),
        out=str(out),
        quick=True,
        extra_args=session_overrides(),
    )
    assert json.loads(out.read_text())["params_bitwise_equal"] == r["params_bitwise_equal"]
    assert r["params_bitwise_equal"], r["params_differ"]
    assert r["model_vars_bitwise_equal"], r["model_vars_differ"]
    assert r["data_order_equal"], r["data_order_differs_at"]
    assert r["replays_identical"]
    # The damaged records were met, skipped and reported alike in both runs, and at least
    # one disruption came after a skip.
    assert r["skipped_records"] >= 1 and len(r["faulty_records"]) >= 1, r["faulty_records"]
    assert r["skips_equal"] and r["disrupted_after_a_skip"], r["skipped_at_steps"]
    events = r["events"]
    chaos_events = run_events.read_events(str(tmp_path / "runs" / "chaos"))
    assert r["disruptions"] == len(events) == 3
    assert sorted(e["kind"] for e in events) == sorted(disruptions.KINDS)
    # At least one SIGKILL landed while Orbax was still writing: its temporary directory
    # was left behind and the restart went back to the save before it.
    during = [e for e in events if e["kind"] == "sigkill_save"]
    assert any(e["uncommitted"] and e["resumed"] < e["trigger_step"] for e in during), during
    every = r["checkpoint_every"]
    for e in events:
        # Every restart restored the latest checkpoint committed when the process died,
        # and lost exactly the steps after it.
        assert e["resumed"] == e["committed"], e
        assert e["steps_lost"] == e["last_step"] - e["resumed"] >= 0, e
        if e["kind"] == "sigterm_step":
            assert e["exit_code"] == 0 and e["steps_lost"] == 0 and e["seconds_lost"] == 0, e
            # It finished the step in flight, saved it (reason "preemption"), waited for
            # the commit and said so, then stopped.
            step = e["preempted"]
            assert step >= e["trigger_step"], e
            assert [(x["event"], x["step"]) for x in _around(chaos_events, step)] == [
                ("checkpoint_saved", step),
                ("checkpoint_committed", step),
                ("preempted", step),
            ]
        else:
            assert e["exit_code"] == -9, e
        if e["kind"] == "sigkill_save":
            # Save N starts only once save N - C has committed.
            assert e["resumed"] >= e["trigger_step"] - every, e
    # A SIGKILL loses the steps since the last COMMITTED save: up to C, or up to 2 C when
    # it lands while the previous asynchronous save is still being written (a kill at
    # step N + 1 with save N in flight goes back to N - C; see the module docstring).
    assert r["max_steps_lost"] <= 2 * every
    assert r["resumed_latest_committed"] and r["sigterm_clean"]
    # Goodput is a ratio of wall times (a figure to report, not a pass criterion): the
    # reference run compiles what the chaos runs then load from the compilation cache,
    # and the other xdist worker's load varies, so it may come out above 1.
    assert r["goodput"] > 0
