"""User device entries: JSON files that `--measure-device` and `--calibrate` write.

An entry is a `Device` row plus its `Efficiency` constants:

    {"name": "mybox", "label": "...", "bf16_flops": ..., "memory_bandwidth": ...,
     "memory_bytes": ..., "intra_node_bandwidth": ..., "inter_node_bandwidth": ...,
     "host_bandwidth": ..., "efficiency": {"mfu_train": ..., ...},
     "provenance": {...free-form: how it was measured or fitted...}}

Entries live in `$HYBRIDFLOW_DEVICES_DIR` (default `~/.hybridflow/devices`) as
NAME.json, or anywhere as a path ending in .json. Keeps no state: every lookup
reads the file.
"""
from __future__ import annotations

import json
import os
from dataclasses import asdict, fields

from .device_spec import Device
from .efficiency import Efficiency

__all__ = ["device_path", "find_user_device", "load_device", "save_device",
           "user_device_names", "user_devices_dir"]


def user_devices_dir() -> str:
    return os.environ.get("HYBRIDFLOW_DEVICES_DIR",
                          os.path.join(os.path.expanduser("~"), ".hybridflow", "devices"))


def device_path(name: str) -> str:
    """Where entry `name` lives: itself if it is a .json path, else NAME.json in the user dir."""
    if name.endswith(".json") or os.sep in name:
        return name
    return os.path.join(user_devices_dir(), f"{name}.json")


def user_device_names() -> list[str]:
    folder = user_devices_dir()
    if not os.path.isdir(folder):
        return []
    return sorted(f[:-5] for f in os.listdir(folder) if f.endswith(".json"))


def find_user_device(name: str) -> Device | None:
    path = device_path(name)
    return load_device(path) if os.path.lexists(path) else None


def load_device(path: str) -> Device:
    from hybridflow.core.loading import read_json
    data = read_json(path, "device entry", dict, "re-measure it with `hybridflow plan "
                     "--measure-device --save NAME`")
    row = {f.name for f in fields(Device)} - {"efficiency"}
    missing = sorted(row - set(data) - {"host_bandwidth", "cpu"})
    if missing:
        raise ValueError(f"device entry {path} lacks {missing}; re-measure it with "
                         "`hybridflow plan --measure-device --save NAME`")
    values = {k: data[k] for k in row if k in data}
    if "cpu" not in data:  # an entry saved before the flag: a CPU if made from one
        provenance = data.get("provenance") or {}
        values["cpu"] = bool(provenance.get("measured")) or \
            provenance.get("start_device") == "cpu"
    efficiency = Efficiency.from_json(data.get("efficiency", {}), where=f"device entry {path}")
    return Device(**values, efficiency=efficiency)


def save_device(device: Device, name: str, provenance: dict | None = None) -> str:
    """Write `device` as entry `name` (a NAME or a .json path); returns the path."""
    path = device_path(name)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    data = asdict(device)
    data["efficiency"] = device.efficiency.to_json()
    data["provenance"] = provenance or {}
    with open(path, "w") as handle:
        json.dump(data, handle, indent=2)
    return path
