"""benchmarks/gpu_plan.py and its library: kernel launches, loops and custom calls of
compiled HLO text (benchmarks/lib/hlo_launches.py), the GPU target's helpers
(benchmarks/lib/gpu_target.py) and the plan's argument handling and table. Nothing is
compiled for a GPU here (that needs .venv-gpuplan: `make gpu-plan`)."""

import importlib.util
import os

import jax
import jax.numpy as jnp
import pytest

from benchmarks.lib import gpu_target
from benchmarks.lib import hlo_launches as hlo

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_spec = importlib.util.spec_from_file_location(
    "gpu_plan_benchmark", os.path.join(ROOT, "benchmarks", "gpu_plan.py")
)
plan = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(plan)

# A hand-written GPU module. ENTRY launches: a fusion, a cuBLAS call, a copy-start, an
# all-reduce-start (their -done halves, parameters, constants, tuples, get-tuple-elements
# and bitcasts launch nothing), a conditional (its larger branch: 3) and a while of 10
# trips whose body has 2 kernels and an inner while of 5 trips of 3 kernels (one a cuDNN
# call): 4 + 3 + 10 * (2 + 5 * 3) = 177. The fusion's own computation has many ops and is
# one kernel; the inner loop's condition is not evaluated (known trip count).
GPU_HLO = """\
HloModule jit_step, is_scheduled=true

%fused_big (p0: f32[8]) -> f32[8] {
  %p0 = f32[8]{0} parameter(0)
  %a = f32[8]{0} add(%p0, %p0)
  %b = f32[8]{0} multiply(%a, %a)
  ROOT %c = f32[8]{0} exponential(%b)
}

%fused_small (p0: f32[8]) -> f32[8] {
  %p0 = f32[8]{0} parameter(0)
  ROOT %n = f32[8]{0} negate(%p0)
}

%add (x: f32[], y: f32[]) -> f32[] {
  %x = f32[] parameter(0)
  %y = f32[] parameter(1)
  ROOT %s = f32[] add(%x, %y)
}

%inner_body (p: (s32[], f32[8])) -> (s32[], f32[8]) {
  %p = (s32[], f32[8]{0}) parameter(0)
  %v = f32[8]{0} get-tuple-element(%p), index=1
  %f1 = f32[8]{0} fusion(%v), kind=kLoop, calls=%fused_small
  %att = (bf16[8]{0}, u8[0]{0}) custom-call(%f1), custom_call_target="__cudnn$fmhaSoftmax", backend_config={"cudnn_fmha_backend_config":{}}
  %f2 = f32[8]{0} fusion(%f1), kind=kLoop, calls=%fused_small
  ROOT %t = (s32[], f32[8]{0}) tuple(%i, %f2)
}

%inner_cond (p: (s32[], f32[8])) -> pred[] {
  %p = (s32[], f32[8]{0}) parameter(0)
  ROOT %lt = pred[] fusion(%p), kind=kLoop, calls=%fused_small
}

%outer_body (p: (s32[], f32[8])) -> (s32[], f32[8]) {
  %p = (s32[], f32[8]{0}) parameter(0)
  %g = f32[8]{0} fusion(%p), kind=kLoop, calls=%fused_big
  %inner = (s32[], f32[8]{0}) while(%p), condition=%inner_cond, body=%inner_body, metadata={op_name="jit(step)/while"}, backend_config={"known_trip_count":{"n":"5"}}
  %mm = (f32[8]{0}, s8[64]{0}) custom-call(%g, %g), custom_call_target="__cublas$lt$matmul", backend_config={"gemm_backend_config":{"dot_dimension_numbers":{"lhs_contracting_dimensions":["0"],"rhs_contracting_dimensions":["0"]}}}
  ROOT %t = (s32[], f32[8]{0}) tuple(%i, %g)
}

%outer_cond (p: (s32[], f32[8])) -> pred[] {
  %p = (s32[], f32[8]{0}) parameter(0)
  ROOT %lt = pred[] fusion(%p), kind=kLoop, calls=%fused_small
}

%branch_a (p: f32[8]) -> f32[8] {
  %p = f32[8]{0} parameter(0)
  ROOT %f = f32[8]{0} fusion(%p), kind=kLoop, calls=%fused_small
}

%branch_b (p: f32[8]) -> f32[8] {
  %p = f32[8]{0} parameter(0)
  %f = f32[8]{0} fusion(%p), kind=kLoop, calls=%fused_small
  %k = f32[8]{0} custom-call(%f), custom_call_target="mosaic_gpu_v2"
  ROOT %g = f32[8]{0} fusion(%k), kind=kCustom, calls=%fused_small, backend_config={"fusion_backend_config":{"kind":"__triton"}}
}

ENTRY %main (a: f32[8], b: bf16[8,8]) -> f32[8] {
  %a = f32[8]{0} parameter(0)
  %b = bf16[8,8]{1,0} parameter(1)
  %k = s32[] constant(1)
  %x = f32[8]{0} fusion(%a), kind=kLoop, calls=%fused_big
  %bc = f32[2,4]{1,0} bitcast(%x)
  %mm = (bf16[8,8]{1,0}, s8[4194304]{0}) custom-call(%b, %b), custom_call_target="__cublas$gemm", backend_config={"gemm_backend_config":{"dot_dimension_numbers":{"lhs_contracting_dimensions":["1"],"rhs_contracting_dimensions":["0"],"lhs_batch_dimensions":[]}}}
  %cs = (f32[8]{0}, f32[8]{0}, u32[]) copy-start(%x)
  %cd = f32[8]{0} copy-done(%cs)
  %ars = f32[8]{0} all-reduce-start(%cd), replica_groups={}, to_apply=%add
  %ard = f32[8]{0} all-reduce-done(%ars)
  %cnd = f32[8]{0} conditional(%k, %ard, %ard), branch_computations={%branch_a, %branch_b}
  %init = (s32[], f32[8]{0}) tuple(%k, %cnd)
  %w = (s32[], f32[8]{0}) while(%init), condition=%outer_cond, body=%outer_body, metadata={op_name="jit(step)/scan"}, backend_config={"known_trip_count":{"n":"10"}}
  ROOT %out = f32[8]{0} get-tuple-element(%w), index=1
}
"""  # noqa: E501


@pytest.fixture(scope="module")
def counts():
    return hlo.count_launches(GPU_HLO)


def test_launches_multiply_nested_loops_and_skip_work_free_ops(counts):
    assert counts["launches"] == 4 + 3 + 10 * (2 + 5 * 3)
    assert counts["by_opcode"] == {
        "fusion": 1 + 2 + 10 * (1 + 5 * 2),  # the conditional's larger branch has 2
        "custom-call": 1 + 1 + 10 * (1 + 5),
        "copy-start": 1,
        "all-reduce-start": 1,
    }
    assert counts["flags"] == ["conditional_largest_branch"]


def test_loops_report_trips_kernels_and_nesting(counts):
    loops = {lp["name"]: lp for lp in counts["loops"]}
    assert loops["w"] | {"op_name": ""} == {
        "name": "w",
        "computation": "main",
        "trip_count": 10,
        "kernels_per_trip": 17,
        "executions": 1,
        "launches": 170,
        "depth": 0,
        "op_name": "",
    }
    assert loops["w"]["op_name"] == "jit(step)/scan"
    inner = loops["inner"]
    assert (inner["trip_count"], inner["kernels_per_trip"], inner["executions"]) == (5, 3, 10)
    assert (inner["launches"], inner["depth"], inner["computation"]) == (150, 1, "outer_body")
    summary = hlo.loop_summary(counts, min_trips=5, max_kernels=2)
    assert summary["per_frame_loops"] == 2
    assert [lp["name"] for lp in summary["largest"]] == ["w", "inner"]
    assert hlo.loop_summary(counts)["per_frame_loops"] == 0  # no loop of 100+ trips


def test_long_loop_launches_count_nested_long_loops_once():
    text = GPU_HLO.replace('"n":"10"', '"n":"200"').replace('"n":"5"', '"n":"150"')
    c = hlo.count_launches(text)
    assert c["launches"] == 7 + 200 * (2 + 150 * 3)
    assert c["long_loop_launches"] == 200 * (2 + 150 * 3)
    assert hlo.count_launches(GPU_HLO, long_loop_trips=6)["long_loop_launches"] == 170
    assert hlo.count_launches(GPU_HLO, long_loop_trips=5)["long_loop_launches"] == 170


def test_gemm_flops_from_shapes_and_contracting_dims(counts):
    # ENTRY: (8, 8) out, lhs (8, 8) contracting dim 1: 2 * 64 * 8; the loop's: 8 out,
    # lhs (8,) contracting dim 0: 2 * 8 * 8, ten times. The cuDNN call is not a GEMM.
    assert counts["gemm_flops"] == 2 * 64 * 8 + 10 * 2 * 8 * 8


def test_custom_calls_by_target_and_family(counts):
    assert counts["custom_calls"] == {
        "__cudnn$fmhaSoftmax": 50,
        "__cublas$lt$matmul": 10,
        "__cublas$gemm": 1,
        "mosaic_gpu_v2": 1,
    }
    assert counts["custom_call_instructions"]["mosaic_gpu_v2"] == 1
    assert counts["custom_fusions"] == {"__triton": 1}
    assert hlo.custom_call_families(counts["custom_calls"]) == {
        "cudnn": 50,
        "cublas": 11,
        "mosaic_gpu": 1,
    }
    assert hlo.custom_call_family("__gpu$xla.gpu.triton") == "triton"
    assert hlo.custom_call_family("Sharding") == "other"


def test_unknown_trip_count_counts_body_and_condition_once_and_flags():
    text = GPU_HLO.replace(', backend_config={"known_trip_count":{"n":"5"}}', "")
    c = hlo.count_launches(text)
    assert c["launches"] == 7 + 10 * (2 + (3 + 1))
    assert "while_unknown_trips" in c["flags"]
    assert hlo.trip_count('%w = while(%i), backend_config={"known_trip_count":{"n":"7"}}') == 7
    assert hlo.trip_count("%w = while(%i), body=%b") is None


def test_no_entry_is_an_error():
    with pytest.raises(ValueError, match="no ENTRY"):
        hlo.count_launches(GPU_HLO.replace("ENTRY %main", "%main"))


def test_real_compiled_scans_multiply_their_trip_counts():
    """XLA's own text (CPU compile): a scan of 4 trips around a scan of 3 trips."""

    def inner(c, x):
        return jnp.sin(c * x) + jnp.cos(c), None

    def outer(c, xs):
        c, _ = jax.lax.scan(inner, c, xs)
        return jnp.tanh(c) * 2.0, None

    def f(c, xss):
        c, _ = jax.lax.scan(outer, c, xss)
        return c

    x = jnp.ones((5,))
    text = jax.jit(f).lower(x, jnp.ones((4, 3, 5))).compile().as_text()
    c = hlo.count_launches(text)
    loops = sorted(c["loops"], key=lambda lp: lp["depth"])
    assert [(lp["trip_count"], lp["executions"], lp["depth"]) for lp in loops] == [
        (4, 1, 0),
        (3, 4, 1),
    ]
    outer_lp, inner_lp = loops
    assert inner_lp["kernels_per_trip"] >= 1
    assert outer_lp["kernels_per_trip"] >= 3 * inner_lp["kernels_per_trip"]
    assert c["launches"] >= 4 * outer_lp["kernels_per_trip"]


def test_gpu_target_config_and_flags():
    text = gpu_target.target_config("h100")
    assert gpu_target.device_description(text) == "NVIDIA H100 80GB HBM3"
    assert gpu_target.dnn_version(text) == 90800  # cuDNN 9.8
    assert gpu_target.device_memory_bytes(text) > 80e9
    assert "h100" in gpu_target.target_names()
    with pytest.raises(ValueError, match="no GPU target 'x9'"):
        gpu_target.target_config("x9")
    flag = "--xla_gpu_enable_triton_gemm=false"
    assert gpu_target.with_flags("") == flag
    assert gpu_target.with_flags("--a=1") == f"--a=1 {flag}"
    assert gpu_target.with_flags("--xla_gpu_enable_triton_gemm=true") == (
        "--xla_gpu_enable_triton_gemm=true"  # an explicit setting wins
    )
    env = {"XLA_FLAGS": "--a=1"}
    gpu_target.configure(env)
    assert env == {"XLA_FLAGS": f"--a=1 {flag}", "JAX_PLATFORMS": "cpu"}


def test_extract_commit_writes_the_commits_files(tmp_path):
    short = plan.extract_commit("HEAD", str(tmp_path))
    assert len(short) >= 7
    assert (tmp_path / "jaxspeech" / "__init__.py").exists()
    with pytest.raises(ValueError, match="git rev-parse"):
        plan.extract_commit("no-such-commit-xyz", str(tmp_path / "x"))


def test_plan_arguments_rows_and_table():
    assert plan.parse_variant("remat:model.conformer.remat=full, loss.x=1") == (
        "remat",
        ["model.conformer.remat=full", "loss.x=1"],
    )
    for bad in ("remat", ":a=1", "r:a"):
        with pytest.raises(ValueError):
            plan.parse_variant(bad)
    assert plan.config_overrides(["--config.model.dtype=float32"]) == ["model.dtype=float32"]
    with pytest.raises(ValueError, match="unrecognized argument '--bogus'"):
        plan.config_overrides(["--bogus"])
    rows = plan.plan_rows(["S", "L"], ["ctc"], [("r", ["a=1"])], baseline=True)
    assert [(r["model"], r["variant"], r["overrides"]) for r in rows] == [
        ("S", "baseline", []),
        ("S", "r", ["a=1"]),
        ("L", "baseline", []),
        ("L", "r", ["a=1"]),
    ]
    assert len(plan.plan_rows(["S"], ["ctc", "ctc+rnnt"], [("r", [])], baseline=False)) == 2
    assert plan.parse_tree("main:HEAD~1") == ("main", "HEAD~1")
    with pytest.raises(ValueError, match="NAME:DIR"):
        plan.parse_tree("HEAD")
    rows = plan.plan_rows(["S"], ["ctc"], [], baseline=True, trees=[("main", "/t")])
    assert [(r["variant"], r["tree"]) for r in rows] == [("baseline", None), ("main", "/t")]
    row = {"model": "S", "head": "ctc", "variant": "baseline"} | plan.summarize_hlo(GPU_HLO)
    row |= {"temp_bytes": 3 * 2**30, "peak_bytes": 4 * 2**30, "compile_s": 12.0}
    lines = plan.table([row, {"model": "L", "head": "ctc", "variant": "x", "error": "boom"}])
    assert lines[2] == (
        "| S | ctc | baseline | 177 | 0 | 0 | 10x17, 5x3 | 11 / 50 / 0 / 1 | 0.00 | 3.0 | 4.0 "
        "| 12 |"
    )
    assert "error: boom" in lines[3] and lines[3].count("|") == lines[2].count("|")


def test_gpu_check_script_parses_and_plans_without_a_gpu(tmp_path):
    """benchmarks/gpu_check.sh's CPU-only parts: its syntax, argument errors as one line,
    and --dry-run (the baseline extracted with git archive, the runs printed, none run)."""
    import subprocess

    script = os.path.join(ROOT, "benchmarks", "gpu_check.sh")
    env = dict(os.environ, GPU_CHECK_DIR=str(tmp_path / "check"), OUT=str(tmp_path / "out"))
    assert subprocess.run(["bash", "-n", script]).returncode == 0
    bad = subprocess.run(["bash", script, "--budget", "x"], capture_output=True, text=True)
    assert bad.returncode == 2
    assert bad.stderr.strip() == "gpu_check.sh: --budget must be whole seconds, got 'x'"
    run = subprocess.run(
        ["bash", script, "--dry-run", "--baseline", "HEAD", "--models", "L"],
        capture_output=True,
        text=True,
        env=env,
    )
    assert run.returncode == 0, run.stderr
    planned = [ln for ln in run.stdout.splitlines() if ln.startswith("would run: ")]
    assert len(planned) == 2  # this tree, then the baseline
    assert all("benchmarks/train_step.py --models L" in ln for ln in planned)
    assert f"--out {tmp_path}/out/train_step_" in planned[0] and "_current_L.json" in planned[0]
    assert "_baseline_L.json" in planned[1] and "--peer" not in planned[1]
