"""Efficiency constants of one device kind: what the cost model multiplies peak numbers by.

A device row (devices.py) holds peak numbers a vendor publishes or a
micro-benchmark measures; an `Efficiency` holds the fractions of those peaks
real software reaches and the fixed costs it adds. The GPU rows share
`GPU_EFFICIENCY`, fitted to published RL runs (bench/planner_fit.py,
docs/placement.md "Calibration against published runs"); a measured or
calibrated device entry carries its own. Stateless: frozen values only.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace


@dataclass(frozen=True)
class Efficiency:
    mfu_train: float = 0.35  # fraction of peak FLOP/s reached by forward+backward
    mfu_forward: float = 0.5  # forward-only passes and rollout prefill
    mfu_decode: float = 0.15  # decode when a batch is large enough to be compute-bound
    hbm_efficiency: float = 0.85  # fraction of peak memory bandwidth reached by decode
    link_efficiency: float = 0.7  # fraction of peak link bandwidth reached by collectives
    intra_node_latency_s: float = 30e-6  # one small collective inside a node (NCCL, not fused)
    inter_node_latency_s: float = 6e-05  # one small collective across nodes
    tp_efficiency_loss: float = 0.10  # compute/bandwidth efficiency lost per doubling of tp
    decode_step_overhead_s: float = 0.002  # scheduler, sampling, launches per decode step
    engine_switch_s: float = 8.0  # rollout engine wake-up/sleep per step (weights, KV, graphs)
    node_call_overhead_s: float = 0.05  # driver dispatch and collect per node call
    step_overhead_s: float = 5.0  # per step: data, metrics, checkpoint-free bookkeeping
    rule_seconds_per_sequence: float = 0.0  # a rule role's own work (e.g. a reward function)
    op_latency_s: float = 0.0  # per operator launch of a pass (matters on CPUs, tiny models)
    host_adam_params_per_s: float = 1e9  # CPU Adam params/s per device, offloaded states

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict, where: str = "device entry") -> Efficiency:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"{where}: unknown efficiency constant(s) {unknown}; "
                             f"known: {sorted(known)}")
        return replace(cls(), **{k: float(v) for k, v in data.items()})

    def tp_factor(self, tp: int) -> float:
        """Efficiency multiplier of a tp-way sharded matmul or weight read (1 at tp=1)."""
        doublings = max(0, tp.bit_length() - 1)
        return 1.0 / (1.0 + self.tp_efficiency_loss * doublings)


GPU_EFFICIENCY = Efficiency()
