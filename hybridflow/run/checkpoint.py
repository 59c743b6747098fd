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

A checkpoint is written under a temporary name (.tmp-step_*) and renamed into place,
so a crash mid-write leaves the previous checkpoint untouched; a write that fails (a
full disk) removes its temporary directory. One that is deleted (retention, a re-save)
is renamed out of the step_* names first (.old-step_*). So every step_* directory is
complete, and a resume verifies the newest and refuses it, by name, when it is not:
it never falls back to an older one, or to none, without being told. Loading never unpickles
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

__all__ = ["CheckpointError", "save_checkpoint", "latest_checkpoint", "newest_verified",
           "checkpoint_dirs", "interrupted_writes", "load_trainer_state", "verify_checkpoint",
           "capture_rng", "restore_rng"]

_PREFIX = "step_"
_TMP = ".tmp-"  # a checkpoint being written
_OLD = ".old-"  # a checkpoint being deleted


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
    tmp = os.path.join(ckpt_root, f"{_TMP}{_PREFIX}{step:06d}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        _write(tmp, step, save_roles, trainer_state)
        if os.path.exists(final):  # re-saving a step (e.g. the final save): replace it
            _discard(final)
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


def _discard(path: str) -> None:
    """Delete a checkpoint: renamed out of the step_* names first, so a delete cut
    short leaves no step_* directory without its files (one a resume would refuse)."""
    trash = os.path.join(os.path.dirname(path), f"{_OLD}{os.path.basename(path)}")
    shutil.rmtree(trash, ignore_errors=True)
    os.rename(path, trash)
    shutil.rmtree(trash, ignore_errors=True)


def checkpoint_dirs(ckpt_root: str) -> list[str]:
    """Every step_* directory, oldest first, complete or not (a write in progress has
    another name, .tmp-step_*, and is never one of them)."""
    if not os.path.isdir(ckpt_root):
        return []
    names = sorted(n for n in os.listdir(ckpt_root) if n.startswith(_PREFIX)
                   and os.path.isdir(os.path.join(ckpt_root, n)))
    return [os.path.join(ckpt_root, n) for n in names]


def interrupted_writes(ckpt_root: str) -> list[str]:
    """The .tmp-step_* directories a save cut short (a crash, SIGKILL) left behind."""
    if not os.path.isdir(ckpt_root):
        return []
    return sorted(n for n in os.listdir(ckpt_root) if n.startswith(_TMP + _PREFIX))


def _retain(ckpt_root: str, keep: int) -> None:
    if keep <= 0:
        return
    for old in checkpoint_dirs(ckpt_root)[:-keep]:
        _discard(old)


def latest_checkpoint(ckpt_root: str) -> str | None:
    """The newest step_* directory, not yet verified: a reader verifies it and names
    what is wrong, rather than silently taking an older one."""
    found = checkpoint_dirs(ckpt_root)
    return found[-1] if found else None


def newest_verified(ckpt_root: str) -> str | None:
    """The checkpoint a resume loads: the newest, every file verified against its
    manifest. None when the run has none; CheckpointError naming it, what is wrong
    with it, and the checkpoint a resume would take once it is deleted."""
    found = checkpoint_dirs(ckpt_root)
    if not found:
        return None
    fix = (f"delete {found[-1]} to resume from {os.path.basename(found[-2])}"
           if len(found) > 1 else "it is the run's only checkpoint: restore it from a "
           "copy, or start a new run (the run directory is left as it is)")
    verify_checkpoint(found[-1], fix)
    return found[-1]


def verify_checkpoint(path: str, fix: str = "") -> dict:
    """Check the manifest and every file it lists (size, then sha256 where recorded:
    older checkpoints have sizes only); returns the manifest. CheckpointError naming
    the checkpoint and the first thing wrong with it."""
    fix = fix or f"delete {path} to resume from the checkpoint before it"
    record, problem = _read_manifest(path)
    if problem is None:
        problem = _first_damaged(path, record)
    if problem is not None:
        raise CheckpointError(f"checkpoint {path} is damaged: {problem}; {fix}")
    return record


_NEEDED = ("trainer_state.json", "rng_torch.safetensors")


def _read_manifest(path: str) -> tuple[dict | None, str | None]:
    """(the manifest, None), or (None, what is wrong with it)."""
    manifest = os.path.join(path, "manifest.json")
    if not os.path.lexists(manifest):
        return None, ("it has no manifest.json (written last: the checkpoint is incomplete, "
                      "or the manifest was deleted)")
    try:
        record = read_json(manifest, "manifest.json", dict)
    except UserFileError as err:
        return None, str(err).replace(f" {manifest!r}", "", 1)
    files, digests = record.get("files"), record.get("sha256", {})
    if not isinstance(files, dict) or not isinstance(digests, dict):
        return None, "manifest.json lacks its 'files' and 'sha256' tables"
    step = os.path.basename(path).removeprefix(_PREFIX)
    if step.isdigit() and record.get("step") != int(step):
        return None, f"manifest.json is of step {record.get('step')!r}, not {int(step)}"
    missing = [name for name in _NEEDED if name not in files]
    if missing:
        return None, f"manifest.json does not list {', '.join(missing)}"
    return record, None


def _first_damaged(path: str, record: dict) -> str | None:
    """The first file the manifest lists that is not as it was saved."""
    digests = record.get("sha256", {})
    for rel, size in record["files"].items():
        full = os.path.join(path, str(rel))
        if not _inside(path, full):  # a manifest never names a file outside its checkpoint
            return f"manifest.json names {rel!r}, outside the checkpoint"
        if not os.path.isfile(full) or os.path.getsize(full) != size:
            return f"{rel} is missing or has the wrong size"
        if rel in digests and file_sha256(full) != digests[rel]:
            return (f"{rel} does not match its sha256 in manifest.json (changed since it "
                    f"was saved)")
    return None


def _inside(root: str, path: str) -> bool:
    root = os.path.realpath(root)
    return os.path.commonpath([root, os.path.realpath(path)]) == root


def load_trainer_state(path: str, verified: bool = False) -> tuple[dict, torch.Tensor]:
    """The driver's state of a checkpoint; `verified`: the caller has just verified
    every file (`newest_verified`), so the sha256 of each is not computed twice."""
    if not verified:
        verify_checkpoint(path)
    fix = f"the checkpoint is damaged: delete {path} to resume from the checkpoint before it"
    state = read_json(os.path.join(path, "trainer_state.json"), "checkpoint state", dict, fix)
    rng = read_safetensors(os.path.join(path, "rng_torch.safetensors"), "checkpoint RNG state",
                           fix)
    if "state" not in rng:
        raise UserFileError(f"checkpoint RNG state {path!r} lacks its tensor; {fix}", path)
    return state, rng["state"]
