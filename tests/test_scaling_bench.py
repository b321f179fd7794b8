"""benchmarks/scaling.py's library: HLO collective parsing and ring bytes
(benchmarks/lib/hlo.py) and the scaling projection (benchmarks/lib/cost_model.py)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec

from benchmarks.lib import cost_model, hlo

# A hand-written module: every collective form the parser must read, a while loop that
# runs its body 3 times, and async -done halves that must not be counted.
HLO = """\
HloModule jit_step, is_scheduled=true, num_partitions=8

%add (x: f32[], y: f32[]) -> f32[] {
  %x = f32[] parameter(0)
  %y = f32[] parameter(1)
  ROOT %s = f32[] add(%x, %y)
}

%body (p: (s32[], f32[16])) -> (s32[], f32[16]) {
  %p = (s32[], f32[16]{0}) parameter(0)
  %v = f32[16]{0} get-tuple-element(%p), index=1
  %ag.loop = f32[64]{0} all-gather(%v), channel_id=9, replica_groups=[2,4]<=[8], dimensions={0}
  ROOT %t = (s32[], f32[16]{0}) tuple(%i, %v)
}

%cond (p: (s32[], f32[16])) -> pred[] {
  %p = (s32[], f32[16]{0}) parameter(0)
  ROOT %lt = pred[] compare(%i, %c), direction=LT
}

ENTRY %main (a: f32[1024], b: bf16[8,128]) -> f32[1024] {
  %a = f32[1024]{0} parameter(0)
  %ar = f32[1024]{0} all-reduce(%a), channel_id=1, replica_groups={{0,1,2,3,4,5,6,7}}, to_apply=%add
  %art = (f32[256]{0}, bf16[8,128]{1,0}, /*index=2*/s32[]) all-reduce(%x, %b, %z), channel_id=2, replica_groups={{0,1},{2,3},{4,5},{6,7}}, to_apply=%add
  %ag = f32[4,64]{1,0} all-gather(%y), channel_id=3, replica_groups=[2,4]<=[4,2]T(1,0), dimensions={0}
  %rs = f32[128]{0} reduce-scatter(%a), channel_id=4, replica_groups=mesh['axis_0'=2,'axis_1'=4] {'axis_1'}, dimensions={0}, to_apply=%add
  %a2a = (f32[1,30]{1,0}, f32[1,30]{1,0}) all-to-all(%p0, %p1), channel_id=5, replica_groups={{0,1},{2,3},{4,5},{6,7}}
  ROOT %cp = f32[100]{0} collective-permute(%a), channel_id=6, source_target_pairs={{0,1},{1,2}}
  %ars = f32[64]{0} all-reduce-start(%q), channel_id=7, replica_groups={}, to_apply=%add
  %ard = f32[64]{0} all-reduce-done(%ars)
  %ags = (f32[8]{0}, f32[64]{0}) all-gather-start(%r), channel_id=8, replica_groups=mesh['axis_0'=8] {'axis_0'}, dimensions={0}
  %agd = f32[64]{0} all-gather-done(%ags)
  %cps = (f32[10]{0}, f32[10]{0}, u32[], u32[]) collective-permute-start(%s), channel_id=10, source_target_pairs={{0,1}}
  %cpd = f32[10]{0} collective-permute-done(%cps)
  %w = (s32[], f32[16]{0}) while(%init), condition=%cond, body=%body, backend_config={"known_trip_count":{"n":"3"}}
}
"""  # noqa: E501


@pytest.fixture(scope="module")
def ops():
    return {o["name"]: o for o in hlo.parse_collectives(HLO)}


def test_parses_every_collective_once(ops):
    assert sorted(ops) == sorted(
        ["ar", "art", "ag", "rs", "a2a", "cp", "ars", "ags", "cps", "ag.loop"]
    )
    assert {o["kind"] for o in ops.values()} == set(hlo.KINDS)
    assert [ops[n]["async"] for n in ("ars", "ags", "cps", "ar")] == [True, True, True, False]


def test_shapes_dtypes_and_tuples(ops):
    assert ops["ar"]["shapes"] == [("f32", (1024,))] and ops["ar"]["bytes"] == 4096
    assert ops["art"]["shapes"] == [("f32", (256,)), ("bf16", (8, 128)), ("s32", ())]
    assert ops["art"]["bytes"] == 256 * 4 + 8 * 128 * 2 + 4
    assert ops["a2a"]["bytes"] == 2 * 30 * 4
    # async starts: the output half of (operands, outputs[, contexts])
    assert ops["ags"]["shapes"] == [("f32", (64,))]
    assert ops["cps"]["shapes"] == [("f32", (10,))]
    assert ops["ars"]["shapes"] == [("f32", (64,))]


def test_replica_group_forms(ops):
    sizes = {n: o["group_size"] for n, o in ops.items()}
    assert sizes["ar"] == 8  # explicit
    assert sizes["art"] == 2 and sizes["a2a"] == 2  # explicit pairs
    assert sizes["ag"] == 4 and sizes["ag.loop"] == 4  # iota, with and without transpose
    assert sizes["rs"] == 4  # mesh axes form, one named axis
    assert sizes["ars"] == 8  # {} = every device (num_partitions)
    assert sizes["ags"] == 8
    assert sizes["cp"] is None
    line = (
        "x = f32[8] all-gather(y), replica_groups=mesh['axis_0'=2,'axis_1'=4] {'axis_0','axis_1'}"
    )
    assert hlo.group_size(line) == 8
    assert hlo.group_size("replica_groups=mesh['a'=8] {'a':(2)4}") == 4  # sub-axis
    reordered = "replica_groups=mesh['axis_0'=2,'axis_1'=4], device_ids=([4,2]T(1,0)) {'axis_0'}"
    assert hlo.group_size(reordered) == 2


def test_while_body_counts_trip_count(ops):
    assert ops["ag.loop"]["executions"] == 3 and ops["ag.loop"]["computation"] == "body"
    assert ops["ar"]["executions"] == 1 and ops["ar"]["computation"] == "main"
    assert all(not o["flags"] for o in ops.values())


def test_ring_bytes(ops):
    assert hlo.ring_bytes(ops["ar"]) == pytest.approx(2 * 7 / 8 * 4096)
    assert hlo.ring_bytes(ops["art"]) == pytest.approx(ops["art"]["bytes"])  # n = 2
    assert hlo.ring_bytes(ops["ag"]) == pytest.approx(3 / 4 * 4 * 64 * 4)
    assert hlo.ring_bytes(ops["rs"]) == pytest.approx(3 * 128 * 4)  # (n-1) x output
    assert hlo.ring_bytes(ops["a2a"]) == pytest.approx(1 / 2 * 240)
    assert hlo.ring_bytes(ops["cp"]) == 400
    assert hlo.ring_bytes(ops["cps"]) == 40
    one = dict(ops["ar"], group_size=1)
    assert hlo.ring_bytes(one) == 0
    summary = hlo.summarize(list(ops.values()))
    assert summary["executions"]["all-gather"] == 1 + 1 + 3
    loop = hlo.ring_bytes(ops["ag.loop"]) * 3
    assert summary["bytes_by_kind"]["all-gather"] == pytest.approx(
        hlo.ring_bytes(ops["ag"]) + hlo.ring_bytes(ops["ags"]) + loop
    )
    assert summary["bytes"] == pytest.approx(
        sum(hlo.ring_bytes(o) * o["executions"] for o in ops.values())
    )


def _compiled_text(fn, mesh, in_spec, out_spec, x):
    # check_vma=False: an all_gather's output is replicated, which shard_map cannot infer.
    shmap = jax.shard_map(fn, mesh=mesh, in_specs=in_spec, out_specs=out_spec, check_vma=False)
    x = jax.device_put(x, NamedSharding(mesh, in_spec))
    compiled = jax.jit(shmap).lower(x).compile()
    return compiled.as_text(), compiled(x)


def test_real_psum_and_all_gather_on_eight_devices():
    """XLA's own text for a psum of 4 KiB per device and an all_gather to 4 KiB."""
    assert len(jax.devices()) >= 8
    mesh = jax.make_mesh((8,), ("d",), devices=jax.devices()[:8])
    x = jnp.arange(8 * 1024, dtype=jnp.float32)
    text, out = _compiled_text(
        lambda a: jax.lax.psum(a, "d"), mesh, PartitionSpec("d"), PartitionSpec("d"), x
    )
    np.testing.assert_allclose(np.asarray(out)[:1024], np.asarray(x).reshape(8, 1024).sum(0))
    ars = [o for o in hlo.parse_collectives(text) if o["kind"] == "all-reduce"]
    assert len(ars) == 1, text
    assert ars[0]["bytes"] == 4096 and ars[0]["group_size"] == 8
    assert hlo.ring_bytes(ars[0]) == pytest.approx(7168)

    y = jnp.arange(8 * 128, dtype=jnp.float32)
    text, out = _compiled_text(
        lambda a: jax.lax.all_gather(a, "d", tiled=True),
        mesh,
        PartitionSpec("d"),
        PartitionSpec(),
        y,
    )
    np.testing.assert_array_equal(np.asarray(out), np.asarray(y))
    ags = [o for o in hlo.parse_collectives(text) if o["kind"] == "all-gather"]
    assert len(ags) == 1, text
    assert ags[0]["bytes"] == 4096 and ags[0]["group_size"] == 8
    assert hlo.ring_bytes(ags[0]) == pytest.approx(3584)


def test_real_psum_over_one_axis_of_a_2x4_mesh():
    mesh = jax.make_mesh((2, 4), ("a", "b"), devices=jax.devices()[:8])
    x = jnp.ones((2, 4 * 256), jnp.float32)
    text, _ = _compiled_text(
        lambda a: jax.lax.psum(a, "b"), mesh, PartitionSpec("a", "b"), PartitionSpec("a", "b"), x
    )
    (ar,) = [o for o in hlo.parse_collectives(text) if o["kind"] == "all-reduce"]
    assert ar["group_size"] == 4 and ar["bytes"] == 256 * 4
    assert hlo.ring_bytes(ar) == pytest.approx(2 * 3 / 4 * 1024)


def test_projection_formulas():
    hw = cost_model.HARDWARE["h100_ib"]
    g = 100e6
    assert cost_model.comm_time("flat", g, 1, hw) == 0
    assert cost_model.comm_time("flat", g, 8, hw) == pytest.approx(
        2 * 7 / 8 * g / hw["intra_bw"] + 14 * hw["intra_latency"]
    )
    # Past one node, fewer latency steps on the slow links: hierarchical wins at 1,024.
    assert cost_model.comm_time("hierarchical", g, 1024, hw) < cost_model.comm_time(
        "flat", g, 1024, hw
    )
    assert cost_model.comm_time("periodic", g, 64, hw) == pytest.approx(
        cost_model.comm_time("flat", g, 64, hw) / cost_model.AVERAGE_EVERY
    )
    rows = cost_model.project(1.0, 0.0, hw)["flat"]  # no gradients: linear scaling
    assert [r["speedup"] for r in rows] == pytest.approx(list(cost_model.PROJECT_N))
    slow = cost_model.project(1e-3, 1e9, hw)["flat"][-1]
    assert slow["efficiency"] < 0.1 and slow["step_ms"] > 1


def test_gradient_accounting_matches_parameter_shapes(ops):
    # Parameters f32[1024] and f32[4,256]: the first all-reduced array matches the first,
    # the second (transposed, f32[256] is not it) is missing; bf16 and scalars are "other".
    acc = hlo.gradient_accounting(list(ops.values()), [("f32", (1024,)), ("f32", (4, 256))])
    assert acc["param_bytes"] == 8192
    assert acc["param_shaped_bytes"] == 4096
    assert acc["missing"] == [["f32[4, 256]", 1]]
    assert acc["other_bytes"] == ops["art"]["bytes"] + ops["ars"]["bytes"]
    flipped = hlo.gradient_accounting(list(ops.values()), [("bf16", (128, 8))])
    assert flipped["param_shaped_bytes"] == 2048 and not flipped["missing"]


def test_compute_for_efficiency_inverts_the_step_model():
    comm = 0.01
    c = cost_model.compute_for_efficiency(comm, 0.9)
    step = c + max(0.0, comm - cost_model.OVERLAP * c)
    assert c / step == pytest.approx(0.9)
