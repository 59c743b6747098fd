"""Device table and cluster shape.

Numbers are vendor peak figures for one device (dense bf16 tensor FLOP/s, HBM
bandwidth, memory) and per-device link bandwidth in one direction: NVLink
inside a node, the network adapter between nodes. The cost model multiplies
them by efficiency constants (see cost.py), so calibrating a new machine means
adding a row here and, if measured, adjusting those constants.
"""
from __future__ import annotations

from dataclasses import dataclass

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


DEVICES: dict[str, Device] = {
    d.name: d
    for d in (
        # A100 SXM: NVLink3 600 GB/s both ways, one 200 Gb/s HDR NIC per GPU.
        Device("a100-80g", "A100-80G", 312 * TERA, 2039 * GB, 80 * GIB, 300 * GB, 25 * GB),
        # A100 40GB SXM: same compute, less and slower HBM.
        Device("a100-40g", "A100-40G", 312 * TERA, 1555 * GB, 40 * GIB, 300 * GB, 25 * GB),
        # H100 SXM: NVLink4 900 GB/s both ways, one 400 Gb/s NDR NIC per GPU.
        Device("h100-80g", "H100-80G", 989 * TERA, 3350 * GB, 80 * GIB, 450 * GB, 50 * GB),
        # H200: H100 compute with 141 GB HBM3e at 4.8 TB/s.
        Device("h200-141g", "H200-141G", 989 * TERA, 4800 * GB, 141 * GIB, 450 * GB, 50 * GB),
        # A CPU "device" is one worker process on a server socket: a few TFLOP/s
        # with AMX, DDR5 bandwidth, plenty of memory, Ethernet between hosts.
        Device("cpu", "CPU", 2 * TERA, 200 * GB, 256 * GIB, 20 * GB, 3 * GB),
    )
}

# Short names users type on the command line.
ALIASES = {"a100": "a100-80g", "h100": "h100-80g", "h200": "h200-141g"}


def get_device(name: str) -> Device:
    key = ALIASES.get(name.lower(), name.lower())
    if key not in DEVICES:
        known = ", ".join(sorted(DEVICES) + sorted(ALIASES))
        raise ValueError(f"unknown device {name!r}; known devices: {known}")
    return DEVICES[key]


@dataclass(frozen=True)
class Cluster:
    """`nodes` machines with `gpus_per_node` identical devices each."""

    nodes: int
    gpus_per_node: int
    device: str

    def __post_init__(self) -> None:
        if self.nodes < 1 or self.gpus_per_node < 1:
            raise ValueError(
                f"a cluster needs at least one node and one device per node, "
                f"got nodes={self.nodes}, gpus_per_node={self.gpus_per_node}"
            )
        get_device(self.device)  # fail early on a typo

    @property
    def spec(self) -> Device:
        return get_device(self.device)

    @property
    def devices(self) -> int:
        return self.nodes * self.gpus_per_node

    def describe(self) -> str:
        return f"{self.nodes} node(s) x {self.gpus_per_node} {self.spec.label}"
