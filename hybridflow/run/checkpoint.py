"""Checkpoints: atomic, complete, and safe to load.

checkpoints/step_000040/
  manifest.json        written last: step, and every file's size and sha256; a
                       directory without it is an interrupted write and is never
                       loaded, and a file whose size or digest differs is refused
  trainer_state.json   step, the run scheduler's state (the data-loader position
                       before the oldest batch not yet trained, and a streaming
                       run's prompt ids not to draw again), stateful function
                       nodes' states, and the driver's Python and numpy RNG state
  rng_torch.safetensors  the driver's torch RNG state
  <role>/              what a trained role's workers save (safetensors weights,
                       optimizer and scheduler via weights_only torch.save, each
                       rank's RNG)
  rng/<role>/          each rank's RNG of a process that hosts no trained role
                       (a rollout on a pool of its own samples from it)

A checkpoint is written under a temporary name and renamed into place, so a crash
mid-write leaves the previous checkpoint untouched; a write that fails (a full disk)
removes its temporary directory. Loading never unpickles
arbitrary objects: JSON, safetensors, and `torch.load(weights_only=True)` only.
"""
from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import time

import numpy as np
import torch
from safetensors.torch import save_file

from hybridflow.core.loading import UserFileError, read_json, read_safetensors

__all__ = ["CheckpointError", "save_checkpoint", "latest_checkpoint", "load_trainer_state",
           "verify_checkpoint", "capture_rng", "restore_rng"]

_PREFIX = "step_"


class CheckpointError(RuntimeError):
    pass


def capture_rng() -> dict:
    np_state = np.random.get_state()
    return {"python": _to_json(random.getstate()),
            "numpy": [np_state[0], np_state[1].tolist(), *np_state[2:]]}


def restore_rng(state: dict, torch_state: torch.Tensor | None) -> None:
    random.setstate(_from_json(state["python"]))
    kind, keys, *rest = state["numpy"]
    np.random.set_state((kind, np.asarray(keys, dtype=np.uint32), *rest))
    if torch_state is not None:
        torch.set_rng_state(torch_state)


def _to_json(value):
    return [_to_json(v) for v in value] if isinstance(value, tuple) else value


def _from_json(value):
    return tuple(_from_json(v) for v in value) if isinstance(value, list) else value


def file_sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _manifest(path: str, step: int) -> dict:
    files, sha256 = {}, {}
    for root, _, names in os.walk(path):
        for name in names:
            full = os.path.join(root, name)
            rel = os.path.relpath(full, path)
            files[rel] = os.path.getsize(full)
            sha256[rel] = file_sha256(full)
    return {"step": step, "time": time.time(), "files": files, "sha256": sha256}


def save_checkpoint(ckpt_root: str, step: int, save_roles, trainer_state: dict,
                    keep: int = 2) -> str:
    """Write a checkpoint atomically. `save_roles(dir)` asks every trained role's
    workers to save into dir/<role>/. Returns the final path."""
    os.makedirs(ckpt_root, exist_ok=True)
    final = os.path.join(ckpt_root, f"{_PREFIX}{step:06d}")
    tmp = os.path.join(ckpt_root, f".tmp-{_PREFIX}{step:06d}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        _write(tmp, step, save_roles, trainer_state)
        if os.path.exists(final):  # re-saving a step (e.g. the final save): replace it
            shutil.rmtree(final)
        os.rename(tmp, final)
    except BaseException:  # a full disk, a signal: leave no half-written directory
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _retain(ckpt_root, keep)
    return final


def _write(tmp: str, step: int, save_roles, trainer_state: dict) -> None:
    os.makedirs(tmp)
    save_roles(tmp)
    with open(os.path.join(tmp, "trainer_state.json"), "w") as fh:
        json.dump({"step": step, **trainer_state, "rng": capture_rng()}, fh)
    save_file({"state": torch.get_rng_state()}, os.path.join(tmp, "rng_torch.safetensors"))
    manifest = _manifest(tmp, step)  # before creating manifest.json, so it is not listed
    with open(os.path.join(tmp, "manifest.json"), "w") as fh:
        json.dump(manifest, fh, indent=1)


def _complete(ckpt_root: str) -> list[str]:
    if not os.path.isdir(ckpt_root):
        return []
    names = sorted(n for n in os.listdir(ckpt_root) if n.startswith(_PREFIX)
                   and os.path.lexists(os.path.join(ckpt_root, n, "manifest.json")))
    return [os.path.join(ckpt_root, n) for n in names]


def _retain(ckpt_root: str, keep: int) -> None:
    if keep <= 0:
        return
    for old in _complete(ckpt_root)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)


def latest_checkpoint(ckpt_root: str) -> str | None:
    done = _complete(ckpt_root)
    return done[-1] if done else None


def verify_checkpoint(path: str) -> dict:
    """Check every file the manifest lists (size, then sha256 where recorded: older
    checkpoints have sizes only); returns the manifest. Raises CheckpointError
    naming the first damaged file."""
    manifest = os.path.join(path, "manifest.json")
    if not os.path.lexists(manifest):
        raise CheckpointError(f"{path} is not a complete checkpoint (no manifest.json)")
    fix = f"the checkpoint is damaged: delete {path} to resume from the checkpoint before it"
    record = read_json(manifest, "checkpoint manifest", dict, fix)
    files, digests = record.get("files"), record.get("sha256", {})
    if not isinstance(files, dict) or not isinstance(digests, dict):
        raise UserFileError(f"checkpoint manifest {manifest!r} lacks its 'files' and "
                            f"'sha256' tables; {fix}", manifest)
    for rel, size in files.items():
        full = os.path.join(path, str(rel))
        if not _inside(path, full):  # a manifest never names a file outside its checkpoint
            raise UserFileError(f"checkpoint manifest {manifest!r} names {rel!r}, outside "
                                f"the checkpoint; {fix}", manifest)
        if not os.path.isfile(full) or os.path.getsize(full) != size:
            problem = "is missing or has the wrong size"
        elif rel in digests and file_sha256(full) != digests[rel]:
            problem = "does not match its sha256 in manifest.json (changed since it was saved)"
        else:
            continue
        raise CheckpointError(f"checkpoint {path} is damaged: {rel} {problem}; delete "
                              f"{path} to resume from the checkpoint before it")
    return record


def _inside(root: str, path: str) -> bool:
    root = os.path.realpath(root)
    return os.path.commonpath([root, os.path.realpath(path)]) == root


def load_trainer_state(path: str) -> tuple[dict, torch.Tensor]:
    verify_checkpoint(path)
    fix = f"the checkpoint is damaged: delete {path} to resume from the checkpoint before it"
    state = read_json(os.path.join(path, "trainer_state.json"), "checkpoint state", dict, fix)
    rng = read_safetensors(os.path.join(path, "rng_torch.safetensors"), "checkpoint RNG state",
                           fix)
    if "state" not in rng:
        raise UserFileError(f"checkpoint RNG state {path!r} lacks its tensor; {fix}", path)
    return state, rng["state"]
