"""One device kind as the cost model sees it: peak rates, memory, links, and efficiencies.

Frozen values only; the table of built-in rows is devices.py, user entries are
device_store.py.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .efficiency import GPU_EFFICIENCY, Efficiency

GB = 1e9
GIB = 1024**3
TERA = 1e12


@dataclass(frozen=True)
class Device:
    name: str
    label: str  # for tables and drawings
    bf16_flops: float  # peak dense bf16 FLOP/s
    memory_bandwidth: float  # HBM bytes/s
    memory_bytes: float  # device memory
    intra_node_bandwidth: float  # bytes/s per device, one direction (NVLink)
    inter_node_bandwidth: float  # bytes/s per device, one direction (IB/RoCE NIC)
    host_bandwidth: float = 25 * GB  # bytes/s device <-> host memory (PCIe), for offload
    efficiency: Efficiency = field(default=GPU_EFFICIENCY)
    # a CPU (the `cpu` entry, one measured here, or one calibrated from a CPU run): a
    # run on this machine then has this machine's memory, not the entry's
    cpu: bool = False
