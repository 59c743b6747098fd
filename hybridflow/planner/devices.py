"""Device table and cluster shape.

Numbers are vendor peak figures for one device (dense bf16 tensor FLOP/s, HBM
bandwidth, memory) and per-device link bandwidth in one direction: NVLink
inside a node, the network adapter between nodes. The cost model multiplies
them by the row's efficiency constants (efficiency.py). Besides the built-in
rows, `get_device` reads user entries: a JSON file written by
`hybridflow plan --measure-device` or `--calibrate` (device_store.py), named by
its path or by NAME for `~/.hybridflow/devices/NAME.json`.
"""
from __future__ import annotations

from dataclasses import dataclass

from .device_spec import GB, GIB, TERA, Device
from .efficiency import Efficiency

__all__ = ["ALIASES", "DEVICES", "GB", "GIB", "TERA", "Cluster", "Device", "get_device"]

DEVICES: dict[str, Device] = {
    d.name: d
    for d in (
        # A100 SXM: NVLink3 600 GB/s both ways, one 200 Gb/s HDR NIC per GPU.
        Device("a100-80g", "A100-80G", 312 * TERA, 2039 * GB, 80 * GIB, 300 * GB, 25 * GB),
        # A100 40GB SXM: same compute, less and slower HBM.
        Device("a100-40g", "A100-40G", 312 * TERA, 1555 * GB, 40 * GIB, 300 * GB, 25 * GB),
        # A800 SXM: the A100 for the Chinese market, NVLink cut to 400 GB/s both ways.
        Device("a800-80g", "A800-80G", 312 * TERA, 2039 * GB, 80 * GIB, 200 * GB, 25 * GB),
        # H100 SXM: NVLink4 900 GB/s both ways, one 400 Gb/s NDR NIC per GPU.
        Device("h100-80g", "H100-80G", 989 * TERA, 3350 * GB, 80 * GIB, 450 * GB, 50 * GB),
        # H200: H100 compute with 141 GB HBM3e at 4.8 TB/s.
        Device("h200-141g", "H200-141G", 989 * TERA, 4800 * GB, 141 * GIB, 450 * GB, 50 * GB),
        # A CPU "device" is one worker process on a server socket: a few TFLOP/s
        # with AMX, DDR5 bandwidth, plenty of memory, Ethernet between hosts.
        Device("cpu", "CPU", 2 * TERA, 200 * GB, 256 * GIB, 20 * GB, 3 * GB, 200 * GB,
               Efficiency(op_latency_s=10e-6, engine_switch_s=0.0, step_overhead_s=0.05,
                          decode_step_overhead_s=2e-3), cpu=True),
    )
}

# Short names users type on the command line.
ALIASES = {"a100": "a100-80g", "a800": "a800-80g", "h100": "h100-80g", "h200": "h200-141g"}


def get_device(name: str) -> Device:
    """A built-in row, or a user entry: a device JSON path, or NAME in the user devices dir."""
    from .device_store import find_user_device, user_device_names

    key = ALIASES.get(name.lower(), name.lower())
    if key in DEVICES:
        return DEVICES[key]
    user = find_user_device(name)
    if user is not None:
        return user
    known = ", ".join(sorted(DEVICES) + sorted(ALIASES) + user_device_names())
    raise ValueError(f"unknown device {name!r}; known devices: {known} (or a device .json "
                     "written by `hybridflow plan --measure-device --save NAME`)")


@dataclass(frozen=True)
class Cluster:
    """`nodes` machines with `gpus_per_node` identical devices each.

    `device` is a device name (a built-in row or a user entry) or a `Device`.
    """

    nodes: int
    gpus_per_node: int
    device: str | Device

    def __post_init__(self) -> None:
        if self.nodes < 1 or self.gpus_per_node < 1:
            raise ValueError(
                f"a cluster needs at least one node and one device per node, "
                f"got nodes={self.nodes}, gpus_per_node={self.gpus_per_node}"
            )
        if not isinstance(self.device, Device):
            get_device(self.device)  # fail early on a typo

    @property
    def spec(self) -> Device:
        return self.device if isinstance(self.device, Device) else get_device(self.device)

    @property
    def devices(self) -> int:
        return self.nodes * self.gpus_per_node

    def describe(self) -> str:
        return f"{self.nodes} node(s) x {self.gpus_per_node} {self.spec.label}"
