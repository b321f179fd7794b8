"""The cost model of gradient communication: ring times on nodes of GPUs, weak scaling.

Projected, not measured. A ring all-reduce of G bytes over N devices takes
2(N-1)/N G / bw + 2(N-1) latency, a reduce-scatter or all-gather half of that; schemes:
  flat: one ring over all N devices (one ring crossing per node per channel: bw = the
    slower of the per-GPU intra-node and the per-node inter-node bandwidth once N > NODE);
  hierarchical: reduce-scatter in the node, all-reduce of each GPU's 1/NODE across the
    N/NODE nodes, all-gather in the node, each stage on its own links;
  periodic: the flat all-reduce once every AVERAGE_EVERY steps (BMUF-style averaging).
Step time T(N) = C + max(0, comm(N) - OVERLAP C) for compute C per step; speedup N C / T.
The HARDWARE constants are stated, not measured. Used by benchmarks/scaling.py (the
projection to 1,024 devices) and benchmarks/sync.py (each sync strategy's projection).
"""

from __future__ import annotations

# ---------------------------------------------------------------------------------------
# Projection constants (stated, not measured). Bandwidths are one direction, per device
# (intra-node) or per node (inter-node); latencies are per ring step.
# ---------------------------------------------------------------------------------------
HARDWARE = {
    "h100_ib": {
        # 40% of H100 SXM dense bf16 peak (989 TFLOP/s): a typical sustained share for a
        # Conformer step with its convolutions, norms and attention on short sequences.
        "flops_per_s": 0.40 * 989e12,
        "intra_bw": 450e9,  # NVLink 4: 900 GB/s bidirectional per GPU
        "inter_bw": 8 * 50e9,  # 8 x 400 Gb/s InfiniBand NDR per node, one NIC per GPU
        "intra_latency": 2e-6,  # NVLink hop
        "inter_latency": 5e-6,  # InfiniBand hop through one switch level
        "label": "H100 node: 40% of 989 TFLOP/s, NVLink 450 GB/s, 8x400 Gb/s IB",
    },
    "v100_eth25": {
        # The references' era: V100 fp32 peak 15.7 TFLOP/s at 40% (their LSTMs trained in
        # fp32); nodes of 8 GPUs with NVLink 2 and one 25 Gb/s Ethernet NIC per node
        # (Amazon's p2/p3 instances; IBM's H-ADPSGD cluster had 100 Gb/s).
        "flops_per_s": 0.40 * 15.7e12,
        "intra_bw": 150e9,  # NVLink 2 (DGX-1 / p3.16xlarge): 6 x 25 GB/s per GPU
        "inter_bw": 25e9 / 8,  # 25 Gb/s Ethernet per node
        "intra_latency": 5e-6,
        "inter_latency": 30e-6,  # TCP over Ethernet
        "label": "V100 node: 40% of 15.7 TFLOP/s fp32, NVLink 150 GB/s, 25 Gb/s Ethernet",
    },
}
NODE = 8  # devices per node
OVERLAP = 0.5  # share of compute that gradient communication can hide behind
AVERAGE_EVERY = 100  # BMUF-style periodic averaging: the references' block size
PROJECT_N = (8, 64, 128, 1024)


def ring_allreduce_time(nbytes: float, n: int, bw: float, latency: float) -> float:
    """Seconds of a ring all-reduce of `nbytes` over n devices: 2(n-1)/n bytes / bw +
    2(n-1) latency."""
    if n <= 1:
        return 0.0
    return 2 * (n - 1) / n * nbytes / bw + 2 * (n - 1) * latency


def ring_half_time(nbytes: float, n: int, bw: float, latency: float) -> float:
    """A ring reduce-scatter or all-gather of `nbytes` (the full array) over n devices."""
    if n <= 1:
        return 0.0
    return (n - 1) / n * nbytes / bw + (n - 1) * latency


def comm_time(scheme: str, grad_bytes: float, n: int, hw: dict) -> float:
    """Seconds of gradient communication per step on n devices (nodes of NODE devices)."""
    if scheme in ("flat", "periodic"):
        if n <= NODE:
            t = ring_allreduce_time(grad_bytes, n, hw["intra_bw"], hw["intra_latency"])
        else:  # one ring crossing per node per channel: the slower of NVLink and the NICs
            bw = min(hw["intra_bw"], hw["inter_bw"])
            t = ring_allreduce_time(grad_bytes, n, bw, hw["inter_latency"])
        return t / AVERAGE_EVERY if scheme == "periodic" else t
    if scheme == "hierarchical":
        local = min(n, NODE)
        nodes = max(1, n // NODE)
        t = 2 * ring_half_time(grad_bytes, local, hw["intra_bw"], hw["intra_latency"])
        # each of the node's GPUs all-reduces its 1/local shard; the node's NICs carry all
        t += ring_allreduce_time(grad_bytes, nodes, hw["inter_bw"], hw["inter_latency"])
        return t
    raise ValueError(f"unknown scheme {scheme!r}")


def project(compute_s: float, grad_bytes: float, hw: dict, ns: tuple[int, ...] = PROJECT_N) -> dict:
    """{scheme: [{n, comm_ms, step_ms, speedup, efficiency}]} for weak scaling."""
    out = {}
    for scheme in ("flat", "hierarchical", "periodic"):
        rows = []
        for n in ns:
            comm = comm_time(scheme, grad_bytes, n, hw)
            step = compute_s + max(0.0, comm - OVERLAP * compute_s)
            speedup = n * compute_s / step
            rows.append(
                {
                    "n": n,
                    "comm_ms": 1e3 * comm,
                    "step_ms": 1e3 * step,
                    "speedup": speedup,
                    "efficiency": speedup / n,
                }
            )
        out[scheme] = rows
    return out


def compute_for_efficiency(comm_s: float, efficiency: float = 0.9) -> float:
    """Least compute per step (s) for which C / T(N) >= efficiency when communication
    takes comm_s: T = C + max(0, comm - OVERLAP C) <= C / efficiency."""
    return comm_s / (OVERLAP + 1 / efficiency - 1)
