"""One writer per run directory (jaxspeech.runs.lease) and what `status` makes of it: two
real processes racing for a lease, a killed holder, a stale heartbeat, a lease taken
over from a live holder, and the states a run reports from its events and its lease."""

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time

import pytest

from jaxspeech.common.errors import UserError
from jaxspeech.runs import lease as lease_lib
from jaxspeech.runs import lifecycle as status_lib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HOLDER = textwrap.dedent(
    """
    import os, sys, time
    from jaxspeech.runs import lease
    run, go = sys.argv[1], sys.argv[2]
    while not os.path.exists(go):  # start together
        time.sleep(0.001)
    try:
        with lease.hold(run, "train", timeout_s=60.0):
            print("held", flush=True)
            time.sleep(float(sys.argv[3]))
    except lease.LeaseHeld as e:
        print("refused:", e, flush=True)
    """
)


def _holder(run, go, hold_s: float) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(run), str(go), str(hold_s)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )


def _record(run, **fields) -> None:
    now = time.time()
    record = {"owner": "other", "kind": "train", "host": socket.gethostname(), "pid": os.getpid()}
    record |= {"started": now, "heartbeat": now, "timeout_s": 60.0} | fields
    os.makedirs(run, exist_ok=True)
    with open(os.path.join(run, lease_lib.LEASE), "w") as f:
        json.dump(record, f)


def _events(run, *names) -> None:
    os.makedirs(run, exist_ok=True)
    with open(os.path.join(run, "events.jsonl"), "w") as f:
        for i, name in enumerate(names):
            f.write(json.dumps({"event": name, "time": 1.0, "step": 4 * i}) + "\n")


def test_two_processes_racing_get_one_lease(tmp_path):
    run, go = tmp_path / "run", tmp_path / "go"
    procs = [_holder(run, go, 2.0) for _ in range(2)]
    go.touch()
    out = sorted(p.communicate(timeout=60)[0].strip() for p in procs)
    assert out[0] == "held", out
    assert out[1].startswith("refused: ") and "is in use by a train job pid" in out[1], out
    assert not (run / lease_lib.LEASE).exists()  # the holder released it


def test_a_killed_holder_is_taken_over_with_a_warning(tmp_path):
    run, go = tmp_path / "run", tmp_path / "go"
    go.touch()
    proc = _holder(run, go, 600.0)
    assert proc.stdout.readline().strip() == "held"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    held = json.loads((run / lease_lib.LEASE).read_text())
    assert held["pid"] == proc.pid  # a kill leaves the lease behind
    warnings = []
    with lease_lib.hold(str(run), "train", 60.0, warn=warnings.append) as lease:
        assert json.loads((run / lease_lib.LEASE).read_text())["owner"] == lease.record["owner"]
    (line,) = warnings
    assert f"pid {proc.pid}" in line and f"its process {proc.pid} no longer exists" in line


def test_a_live_holder_refuses_and_a_stale_heartbeat_is_taken_over(tmp_path):
    run = str(tmp_path / "run")
    _record(run)  # this process, a fresh heartbeat: alive
    with pytest.raises(
        lease_lib.LeaseHeld, match=r"in use by a train job pid \d+ .*\(heartbeat 0s ago"
    ):
        with lease_lib.hold(run, "train", 60.0):
            pass
    _record(run, host="elsewhere", heartbeat=time.time() - 30)  # another host, recent
    with pytest.raises(lease_lib.LeaseHeld, match="on host elsewhere"):
        with lease_lib.hold(run, "train", 60.0):
            pass
    _record(run, host="elsewhere", heartbeat=time.time() - 61)  # another host, silent
    warnings = []
    with lease_lib.hold(run, "train", 60.0, warn=warnings.append):
        pass
    assert "its heartbeat is 61s old (timeout 60s)" in warnings[0]


def test_the_heartbeat_renews_and_a_taken_over_lease_is_noticed(tmp_path):
    run = str(tmp_path / "run")
    with lease_lib.hold(run, "train", timeout_s=0.5) as lease:  # renewed every 0.05 s
        path = os.path.join(run, lease_lib.LEASE)
        first = json.load(open(path))["heartbeat"]
        deadline = time.time() + 30
        while json.load(open(path))["heartbeat"] == first and time.time() < deadline:
            time.sleep(0.01)
        assert json.load(open(path))["heartbeat"] > first
        _record(run, owner="thief", pid=1, host="elsewhere")
        while lease.lost is None and time.time() < deadline:
            time.sleep(0.01)
        with pytest.raises(lease_lib.LeaseLost, match="now held by train job pid 1 on host"):
            lease.check()
    assert json.load(open(path))["owner"] == "thief"  # release leaves another's lease


def test_a_file_as_the_directory_is_one_clear_error(tmp_path):
    wd = tmp_path / "wdfile"
    wd.write_text("x")
    with pytest.raises(UserError, match="wdfile is a file, not a directory"):
        with lease_lib.hold(str(wd), "train", 60.0):
            pass


@pytest.mark.parametrize(
    "names,lease,state",
    [
        (["started"], None, "dead"),  # killed before it could say, no lease left
        (["started"], {}, "running"),  # a live holder
        (["started"], {"pid": 2**22 + 7}, "dead"),  # its process is gone
        (["started"], {"host": "h", "heartbeat": 0.0}, "dead"),  # silent for too long
        (["started", "failed"], None, "failed"),
        (["started", "finished"], None, "finished"),
    ],
)
def test_status_reads_the_events_and_the_lease(tmp_path, names, lease, state):
    run = str(tmp_path / "run")
    _events(run, "checkpoint_committed", *names)
    if lease is not None:
        _record(run, **lease)
    got = status_lib.run_status(run)
    assert got["state"] == state, got
    assert got["committed"] == 0
    if state == "dead":
        assert "why" in got


def test_status_names_what_the_last_invocations_trackers_missed(tmp_path):
    run = str(tmp_path / "run")
    rows = [
        {"event": "started", "step": 0},
        {"event": "tracker_drops", "trackers": {"mlflow": {"values": 3, "files": 1}}},
        {"event": "started", "step": 4},  # a new invocation: its own count
        {"event": "finished", "step": 8},
        {"event": "tracker_drops", "trackers": {"mlflow": {"values": 20, "files": 0}}},
    ]
    os.makedirs(run)
    with open(os.path.join(run, "events.jsonl"), "w") as f:
        f.writelines(json.dumps(r | {"time": 1.0}) + "\n" for r in rows)
    got = status_lib.run_status(run)
    assert got["tracker_drops"] == "mlflow 20 values 0 files"
    assert "tracker_drops='mlflow 20 values 0 files'" in status_lib.describe(got)
    with open(os.path.join(run, "events.jsonl"), "w") as f:
        f.writelines(json.dumps(r | {"time": 1.0}) + "\n" for r in rows[2:4])
    assert "tracker_drops" not in status_lib.run_status(run)
