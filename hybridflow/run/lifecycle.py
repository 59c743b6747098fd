"""A run's life in its directory: what a resume must match, how an end is recorded.

Stateless: everything it knows it reads from, or writes to, the run directory
(graph.json, config.yaml, status.json, error.log; see tracking.py).

A resume is validated before anything in the directory is written: the graph must
be the one the run was made with (by name; a changed file is a warning, by its
sha256), and the configuration must equal the saved one except for the keys the
user sets on purpose on the resume's command line (overrides, --config file), and
the checkpoint must be usable (`resume_checkpoint`): a run that has written history
and has no usable checkpoint is refused, never started again at step 0 over it.
"""
from __future__ import annotations

import hashlib
import os
import traceback

from omegaconf import DictConfig, OmegaConf

from hybridflow.core.loading import read_yaml
from hybridflow.run.checkpoint import CheckpointError, interrupted_writes, newest_verified
from hybridflow.run.tracking import RECORD_FILES, RunDir

__all__ = ["ResumeError", "graph_identity", "check_same_graph", "config_changes",
           "check_resumed_config", "explicit_keys", "record_end", "resume_checkpoint",
           "run_history"]


class ResumeError(ValueError):
    """A resume that does not match the run it would continue."""


def graph_identity(graph_name: str, graph_path: str) -> dict:
    with open(graph_path, "rb") as fh:
        digest = hashlib.sha256(fh.read()).hexdigest()
    return {"name": graph_name, "file": os.path.abspath(graph_path), "sha256": digest}


def check_same_graph(run: RunDir, identity: dict) -> list[str]:
    """ResumeError for another graph; warnings for a changed file or an old run."""
    saved = run.graph_identity()
    if saved is None:
        note = (f"{run.path} has no graph.json (made by an older hybridflow): the graph "
                f"it was made with is not checked")
        return [note]
    if saved["name"] != identity["name"]:
        raise ResumeError(f"--resume {run.path}: the run was made by graph "
                          f"'{saved['name']}' ({saved['file']}), not '{identity['name']}' "
                          f"({identity['file']}); resume it with its own graph file, or "
                          f"start a new run")
    if saved["sha256"] != identity["sha256"]:
        note = (f"graph file {identity['file']} differs from the one the run started with "
                f"({saved['file']}, sha256 {saved['sha256'][:12]} -> "
                f"{identity['sha256'][:12]}); resuming with the file as it is now")
        return [note]
    return []


def _flatten(value, prefix: str = "") -> dict:
    """{'a.b': leaf}; an empty section has no leaves (empty and absent are alike)."""
    if isinstance(value, dict):
        out = {}
        for key, item in value.items():
            out.update(_flatten(item, f"{prefix}{key}."))
        return out
    return {prefix[:-1]: value}


def config_changes(saved: DictConfig, now: DictConfig) -> list[tuple[str, object, object]]:
    """(key, saved value, current value) for every leaf that differs; a missing side
    is `<unset>`."""
    missing = "<unset>"
    old = _flatten(OmegaConf.to_container(saved, resolve=False))
    new = _flatten(OmegaConf.to_container(now, resolve=False))
    pairs = {key: (old.get(key, missing), new.get(key, missing)) for key in set(old) | set(new)}
    return [(key, *pairs[key]) for key in sorted(pairs) if pairs[key][0] != pairs[key][1]]


def explicit_keys(overrides: list[str], yaml_file: str | None) -> set[str]:
    """The keys a user sets on purpose: each override's key, each leaf of --config."""
    keys = {o.partition("=")[0].strip().lstrip("+~") for o in overrides if "=" in o}
    if "placement" in keys:  # `placement=auto` replans the whole section
        keys.add("placement")
    if yaml_file:
        keys |= set(_flatten(OmegaConf.to_container(read_yaml(yaml_file, "config file"))))
    return keys


def _is_explicit(key: str, explicit: set[str]) -> bool:
    return any(key == k or key.startswith(k + ".") for k in explicit)


def check_resumed_config(run: RunDir, saved: DictConfig, now: DictConfig,
                         explicit: set[str]) -> list[str]:
    """ResumeError listing, key by key, what differs from the saved config without
    being asked for; returns one line for each change that was asked for."""
    changes = config_changes(saved, now)
    unasked = [c for c in changes if not _is_explicit(c[0], explicit)]
    if unasked:
        lines = "\n".join(f"  {key}: {old!r} (saved) -> {new!r}" for key, old, new in unasked)
        raise ResumeError(f"--resume {run.path}: the configuration differs from the run's "
                          f"config.yaml:\n{lines}\nnothing was changed in the run directory; "
                          f"set a key on the command line (key=value) to change it on "
                          f"purpose")
    return [f"changed on resume: {key}: {old!r} -> {new!r}" for key, old, new in changes]


_UNCHANGED = "nothing in the run directory was changed"


def resume_checkpoint(run: RunDir) -> str | None:
    """The checkpoint a resume loads, every file verified; None for a run that has
    written nothing yet (it starts at step 0, and nothing is lost). ResumeError when
    the newest checkpoint is damaged or partial (naming it and what is wrong), and
    when there is none but the run has history a start at step 0 would overwrite."""
    try:
        path = newest_verified(run.checkpoints)
    except CheckpointError as err:
        raise ResumeError(f"--resume {run.path}: {err}; {_UNCHANGED}") from None
    if path is not None:
        return path
    history = run_history(run)
    if history:
        raise ResumeError(f"--resume {run.path}: no checkpoint to resume from "
                          f"({_no_checkpoint(run.checkpoints)}), but the run has written "
                          f"{', '.join(history)}, which a start at step 0 would overwrite; "
                          f"{_UNCHANGED}: restore the checkpoint, or start a new run "
                          f"(without --resume)")
    return None


def _no_checkpoint(root: str) -> str:
    """Why a run's checkpoints folder holds no checkpoint."""
    if not os.path.lexists(root):
        return f"{root} does not exist"
    if not os.path.isdir(root):
        return f"{root} is not a directory"
    cut = interrupted_writes(root)
    if cut:
        return f"{root} holds only a write cut short, {cut[-1]}, which is never loaded"
    entries = sorted(os.listdir(root))
    return (f"{root} has no step_* directory (it holds {', '.join(entries[:3])})"
            if entries else f"{root} is empty")


def run_history(run: RunDir) -> list[str]:
    """What a run has written that a start from step 0 would overwrite: records
    with content, a status past step 0, anything in its checkpoints folder."""
    found = [name for name in RECORD_FILES
             if os.path.isfile(run.file(name)) and os.path.getsize(run.file(name)) > 0]
    step = run.status().get("step")
    if isinstance(step, int) and step > 0:
        found.append(f"status.json at step {step}")
    if os.path.isdir(run.checkpoints) and os.listdir(run.checkpoints):
        found.append("checkpoints/")
    return found


def record_end(run: RunDir, state: str, step: int, err: BaseException | None = None,
               **info) -> list[str]:
    """Write status.json (and the traceback to error.log), as far as the disk lets us:
    returns a note for each record that could not be written (a full disk)."""
    notes = []
    trace = traceback.format_exception(err) if err is not None else None
    if trace:
        try:
            run.log_error("".join(trace))
        except OSError as write_err:
            notes.append(f"could not write {run.file('error.log')}: {write_err.strerror}")
    try:
        run.set_status(state, step=step, **info,
                       **({"traceback": "".join(trace)} if trace else {}))
    except OSError as write_err:
        notes.append(f"could not record '{state}' in {run.file('status.json')}: "
                     f"{write_err.strerror}")
    return notes
