"""benchmarks/train_step.py --peer without torch: the peer's spec and command
(benchmarks/lib/peer.py), the rows of both frameworks (benchmarks/lib/step_rows.py) and
the driver with fake workers. The peer itself (benchmarks/lib/torch_peer.py) needs torch
and torchaudio (`make install-peer`) and runs only as a benchmark."""

import argparse
import importlib.util
import json
import os
import stat
import sys

import pytest

from benchmarks.lib import peer, step_rows

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_spec = importlib.util.spec_from_file_location(
    "train_step_benchmark_peer", os.path.join(ROOT, "benchmarks", "train_step.py")
)
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)


def test_peer_spec_and_command_follow_the_config():
    config = bench.model_config("S", "float32", ["model.conformer.dropout=0.0"])
    cmd = peer.command("py", config, model="S", dtype="float32", batch=4, seconds=8.0)
    assert cmd[:3] == ["py", "-m", "benchmarks.lib.torch_peer"]
    job = json.loads(cmd[3])
    assert job["label_width"] == 80  # an 8 s bucket at 10 tokens/s, as ours
    assert (job["model"], job["batch"], job["seconds"]) == ("S", 4, 8.0)
    spec = job["spec"]
    # configs/conformer.py's S: 144 wide, 16 blocks, 4 heads, kernel 31, 144 channels.
    assert (spec["dim"], spec["num_layers"], spec["num_heads"]) == (144, 16, 4)
    assert (spec["ffn_dim"], spec["conv_kernel"], spec["subsampling_channels"]) == (576, 31, 144)
    assert (spec["predictor_dim"], spec["joiner_dim"], spec["head"]) == (256, 256, "ctc+rnnt")
    assert spec["dropout"] == 0.0 and spec["features"]["num_mel_bins"] == 80
    assert spec["optim"]["clip_norm"] == config.optim.clip_norm
    assert peer.spec_from_config(bench.model_config("L", "bfloat16"))["dim"] == 512
    ctc = peer.spec_from_config(bench.model_config("S", "float32", ["model.head=ctc"]))
    assert ctc["head"] == "ctc"
    for bad, says in [
        (["model.head=ctc+aed"], "head"),
        (["model.transducer.predictor=lstm"], "stateless"),
        (["features.kind=mfcc"], "log-mel"),
    ]:
        with pytest.raises(SystemExit, match=says):
            peer.spec_from_config(bench.model_config("S", "float32", bad))


def test_peer_python_default_and_check(tmp_path):
    assert peer.default_python(str(tmp_path)) == sys.executable
    venv_python = tmp_path / ".venv-peer" / "bin" / "python"
    venv_python.parent.mkdir(parents=True)
    venv_python.write_text("#!/bin/sh\necho 'ModuleNotFoundError: no torch' >&2\nexit 1\n")
    venv_python.chmod(venv_python.stat().st_mode | stat.S_IEXEC)
    assert peer.default_python(str(tmp_path)) == str(venv_python)
    with pytest.raises(SystemExit, match="cannot import torch and torchaudio.*no torch"):
        peer.check_python(str(venv_python))
    with pytest.raises(SystemExit, match="make install-peer"):
        peer.check_python(str(tmp_path / "missing"))


def _ours(size, dtype, batch, seconds, repeats):
    return {
        "model": size, "framework": "jaxspeech", "device": "cpu", "dtype": dtype,
        "num_devices": 1, "params_m": 9.3, "batch": batch, "seconds": seconds,
        "label_width": 80, "repeats": repeats, "step_ms": 4000.0,
        "model_gflop_per_step": 500.0, "compile_s": 30.0, "loss_first": 60.0, "loss_last": 59.0,
    }  # fmt: skip


def test_driver_adds_the_peer_row_after_ours(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(peer, "check_python", lambda python: "2.14.1 2.11.1")

    def fake_worker(what):
        if what[0] == "probe":
            return {"platform": "cpu", "device_kind": "cpu", "device_count": 1, "jax": "x"}
        size, dtype = what[0].split(":")
        return _ours(size, dtype, int(what[1]), float(what[2]), int(what[3]))

    peer_calls = []

    def fake_peer(cmd, timeout_s, what, tail, cwd=None):
        job = json.loads(cmd[3])
        peer_calls.append((cmd[0], cwd, job))
        if job["model"] == "M":  # the peer of M fails; its row is missing and recorded
            raise RuntimeError("peer failed:\nTraceback ...\nRuntimeError: boom")
        return {
            "model": job["model"], "framework": "pytorch", "device": "cpu",
            "dtype": job["dtype"], "num_devices": 1, "params_m": 8.8, "batch": job["batch"],
            "seconds": job["seconds"], "label_width": 30, "repeats": job["repeats"],
            "step_ms": 2000.0, "loss_first": 300.0, "loss_last": 100.0,
        }  # fmt: skip

    monkeypatch.setattr(bench, "run_worker", fake_worker)
    monkeypatch.setattr(peer.workers, "last_json_line", fake_peer)
    out = tmp_path / "train_step.json"
    args = argparse.Namespace(
        quick=False, models="S,M", dtype=None, batch=4, seconds=4.0, repeats=2,
        peak_tflops=1.0, device_hour_price=0.0, set=[], peer=True, peer_python="/peer/python",
        out=str(out),
    )  # fmt: skip
    result = bench.run(args)
    assert [(c[0], c[1], c[2]["model"], c[2]["batch"]) for c in peer_calls] == [
        ("/peer/python", ROOT, "S", 4),
        ("/peer/python", ROOT, "M", 4),
    ]
    saved = json.loads(out.read_text())
    assert [(r["model"], r["framework"]) for r in saved["rows"]] == [
        ("S", "jaxspeech"),
        ("S", "pytorch"),
        ("M", "jaxspeech"),
    ]
    p = saved["rows"][1]
    assert p["audio_s_per_s"] == pytest.approx(4 * 4.0 / 2.0) and p["mfu"] is None
    failed = saved["peer_not_measured"]
    assert [(f["model"], f["failed"], f["error"]) for f in failed] == [
        ("M", True, "RuntimeError: boom")
    ]
    printed = capsys.readouterr().out
    assert "| S | pytorch | cpu | float32 | 8.8 | 4 x 4 s | 2000 | 8.0 | - |" in printed
    assert "M float32 PyTorch peer, batch 4: failed: RuntimeError: boom" in printed
    assert (
        "S float32: jaxspeech 4000 ms, 4.0 audio s/s, 9.3 M params | PyTorch peer 2000 ms, "
        "8.0 audio s/s, 8.8 M params | ours / peer: 0.50x" in printed
    )
    assert result["goal"].endswith("not judged on this CPU")


def test_rows_interleave_and_compare():
    s, m = {"model": "S", "dtype": "f"}, {"model": "M", "dtype": "f"}
    ps, pl = {"model": "S", "dtype": "f", "framework": "pytorch"}, {"model": "L", "dtype": "f"}
    assert step_rows.interleave([s, m], [pl, ps]) == [s, ps, m, pl]
    base = {"step_ms": 100.0, "params_m": 1.0, "batch": 2, "seconds": 1.0}
    ours = {"model": "L", "dtype": "b"} | base | {"audio_s_per_s": 20.0}
    ours["peak_bytes_in_use_mib"] = 2048.0
    them = {"model": "L", "dtype": "b", "framework": "pytorch"} | base | {"audio_s_per_s": 10.0}
    them["batch"] = 4
    (line,) = step_rows.comparison_lines([ours, them])
    assert "peak 2.0 GiB" in line and line.endswith("ours / peer: 2.00x (different batches)")
    assert step_rows.comparison_lines([them]) == []  # ours did not fit: nothing to compare
