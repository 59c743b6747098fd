"""`hybridflow status RUN_DIR`: how a run stands, telling a live run from a dead one.

status.json says `running` until the process records its end; after a SIGKILL (or
a lost machine) it never does. The run's lock (run/lock.py) tells the two apart on
the host that ran it: a live owner is running, a gone one died without a word.
"""
from __future__ import annotations

import argparse
import os
import time

from hybridflow.run.lock import read_owner
from hybridflow.run.tracking import RunDir, RunDirError
from hybridflow.core.printable import echo

__all__ = ["add_parser", "run", "describe"]


def add_parser(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser("status", help="how a run stands (running, died, finished...)")
    parser.add_argument("run_dir", help="a run directory made by `hybridflow run`")
    return parser


def _ago(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f}s ago"
    return f"{seconds / 60:.0f} min ago" if seconds < 7200 else f"{seconds / 3600:.1f} h ago"


def _running(run: RunDir, status: dict, progress: str) -> str:
    owner = read_owner(run.path, strict=True)
    updated = _ago(time.time() - status.get("time", time.time()))
    if owner is not None and owner.alive():
        return f"running ({owner.describe()}), {progress}, last update {updated}"
    if owner is not None and owner.alive() is None:
        return (f"running on another host ({owner.describe()}), {progress}, last update "
                f"{updated}; it cannot be checked from here")
    who = f"pid {status['pid']} on {status.get('host')}" if "pid" in status else "its process"
    return (f"died without a word at {progress} ({who} is gone; last update {updated}); "
            f"continue it with `hybridflow run GRAPH --resume {run.path}`")


_FIELDS = {"state": str, "step": int, "steps": int, "time": (int, float), "pid": int}


def _checked(run: RunDir, status: dict) -> dict:
    """status.json's fields have the types the run writes (someone else's hand may not)."""
    from hybridflow.core.loading import UserFileError
    for key, kind in _FIELDS.items():
        value = status.get(key)
        if value is not None and (not isinstance(value, kind) or isinstance(value, bool)):
            raise UserFileError(f"run status {run.file('status.json')!r}: field {key!r} is "
                                f"{value!r}, not what `hybridflow run` writes; the run "
                                f"directory is damaged: delete status.json to reset it",
                                run.file("status.json"))
    return status


def describe(run_path: str) -> str:
    """One line: the state, the step, and what to do next where there is something."""
    from hybridflow.core.loading import check_dir, describe_path
    check_dir(run_path, "run directory", "give a directory made by `hybridflow run`")
    if describe_path(os.path.join(run_path, "config.yaml")) == "missing":
        raise RunDirError(f"{run_path} is not a run directory (no config.yaml)")
    run = RunDir(run_path, create=False)
    status = _checked(run, run.status())
    state = status.get("state")
    steps = f"/{status['steps']}" if status.get("steps") else ""
    progress = f"step {status.get('step', 0)}{steps}"
    if state in (None, "starting"):  # datasets and workers loading
        owner = read_owner(run.path, strict=True)
        if owner is not None and owner.alive() is not False:
            return f"starting ({owner.describe()})"
        return ("never started (no status.json)" if state is None else
                "died during start-up without a word")
    if state == "running":
        return _running(run, status, progress)
    if state == "failed":
        return f"failed at {progress}: {status.get('reason')} (details: {run.file('error.log')})"
    if state == "interrupted":
        saved = status.get("checkpoint") or "no checkpoint"
        return f"interrupted by {status.get('signal', 'a signal')} at {progress} ({saved})"
    return f"{state} at {progress}"


def run(args) -> int:
    echo(f"{args.run_dir}: {describe(args.run_dir)}")
    return 0
