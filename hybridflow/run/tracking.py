"""A run's directory and what is written to it as the run goes.

runs/<graph>-<time>/
  config.yaml       the merged config
  graph.json        the graph's name, file and the file's sha256 (checked on resume)
  plan.json         the compiled graph as data, for the commands that read a run
                    (program/run_record.py)
  metrics.jsonl     one line per step (appended to on resume; the lines of steps after
                    the checkpoint, redone, move to metrics.superseded.jsonl, as do
                    timeline.jsonl's and generations.jsonl's)
  timeline.jsonl    per-node start/end of each step, for `hybridflow render --timeline`
  generations.jsonl sample prompts, responses and scores (generations.py)
  status.json       starting / running (with the current step) / finished / failed /
                    interrupted
  error.log         the traceback of every failure, appended
  lock.json         the owner (pid, host, start) while a process runs; run/lock.py
  checkpoints/      see hybridflow/run/checkpoint.py
  batches/          the steps of trainer.dump_batches (run/batch_dump.py)
  tensorboard/, wandb/  with trainer.tensorboard / trainer.wandb

Every whole-file write (status.json, graph.json, the trimmed metrics on resume) goes
to a temporary file that is renamed into place, and the temporary file is removed
when the write fails, so a reader sees the old content or the new, never half.
"""
from __future__ import annotations

import contextlib
import glob
import itertools
import json
import math
import os
import socket
import time

from omegaconf import DictConfig, OmegaConf

from hybridflow.core.files import write_atomic

__all__ = ["RunDir", "RunDirError", "new_run_dir", "newest_run_dir", "MetricSinks",
           "write_atomic", "read_jsonl", "RECORD_FILES"]


class RunDirError(ValueError):
    """A run directory whose files cannot be read as hybridflow wrote them."""


def read_jsonl(path: str) -> tuple[list[dict], str | None]:
    """The records of a JSON-lines file, and a note when its last line was torn (what
    a crash or a full disk leaves): that line is dropped. A bad line before the last
    is damage no crash makes: UserFileError naming the file and line."""
    from hybridflow.core.loading import UserFileError, parse_json, read_text
    if not os.path.lexists(path):
        return [], None
    what, fix = "run record", "fix or delete that line"
    numbered = [(n, line) for n, line in enumerate(
        read_text(path, what, fix, empty_ok=True).splitlines(), 1) if line.strip()]
    records = []
    for i, (number, line) in enumerate(numbered):
        try:
            records.append(parse_json(line, what, path, fix, dict, number))
        except UserFileError as err:
            if i < len(numbered) - 1:
                raise
            return records, (f"{path}:{number}: dropped a torn last line (a crash or a "
                             f"full disk cut it short: {err})")
    return records, None


class RunDir:
    def __init__(self, path: str, create: bool = True):
        self.path = path
        if create:
            os.makedirs(path, exist_ok=True)

    def file(self, name: str) -> str:
        return os.path.join(self.path, name)

    @property
    def checkpoints(self) -> str:
        return self.file("checkpoints")

    def save_config(self, cfg: DictConfig) -> None:
        _write_changed(self.file("config.yaml"), OmegaConf.to_yaml(cfg))

    def set_status(self, state: str, **info) -> None:
        """Replace status.json atomically: the state, the current step, who writes it."""
        record = {"state": state, "time": time.time(), "pid": os.getpid(),
                  "host": socket.gethostname(), **info}
        write_atomic(self.file("status.json"), json.dumps(record, indent=1))

    def status(self) -> dict:
        """status.json, or {} before the run wrote it; UserFileError when it is damaged
        (the run's own writes are atomic: only someone else's hand damages it)."""
        from hybridflow.core.loading import read_json
        if not os.path.lexists(self.file("status.json")):
            return {}
        return read_json(self.file("status.json"), "run status",
                         fix="the run directory is damaged: delete status.json to reset it")

    def log_error(self, text: str) -> str:
        """Append a failure's traceback to error.log; returns the file's path."""
        path = self.file("error.log")
        with open(path, "a") as fh:
            fh.write(f"--- {time.strftime('%Y-%m-%d %H:%M:%S')} pid {os.getpid()}\n{text}\n")
        return path

    def save_json(self, name: str, record: dict) -> None:
        """Write a record of the run (e.g. plan.json) atomically."""
        _write_changed(self.file(name), json.dumps(record, indent=1))

    def save_graph_identity(self, identity: dict) -> None:
        write_atomic(self.file("graph.json"), json.dumps(identity, indent=1))

    def graph_identity(self) -> dict | None:
        """graph.json, or None for a run made before it was written."""
        from hybridflow.core.loading import read_json
        if not os.path.lexists(self.file("graph.json")):
            return None
        return read_json(self.file("graph.json"), "run graph record",
                         fix="the run directory is damaged: restore or delete graph.json")

    def read_metrics(self) -> list[dict]:
        return read_jsonl(self.file("metrics.jsonl"))[0]

    def truncate_metrics(self, last_step: int | None) -> list[str]:
        """On resume, set aside the metric, timeline and sample lines of steps after the
        checkpoint (they will be redone): they move to `<name>.superseded.jsonl`, never
        lost; None keeps every record (a validation-only look appends). A torn last line
        (what a crash leaves) is dropped. A file with nothing to change is not written.
        Returns a note for each torn line dropped and each file whose lines moved."""
        notes = []
        for name in RECORD_FILES:
            if not os.path.exists(self.file(name)):
                continue
            records, note = read_jsonl(self.file(name))
            notes += [note] if note else []
            kept = records if last_step is None else \
                [m for m in records if m.get("step", 0) <= last_step]
            late = [m for m in records if last_step is not None
                    and m.get("step", 0) > last_step]
            if not late and note is None:
                continue
            if late:
                aside = self.file(name.replace(".jsonl", ".superseded.jsonl"))
                _append_lines(aside, late)
                steps = sorted({m.get("step", 0) for m in late})
                notes.append(f"{self.file(name)}: moved the {len(late)} line(s) of step(s) "
                             f"{steps[0]}-{steps[-1]}, to be redone, to {aside}")
            write_atomic(self.file(name), "".join(json.dumps(m) + "\n" for m in kept))
        return notes


RECORD_FILES = ("metrics.jsonl", "timeline.jsonl", "generations.jsonl")


def _write_changed(path: str, text: str) -> None:
    """Write `text` atomically unless the file holds it already (a resume that changes
    no key leaves config.yaml as it was, bytes and time)."""
    try:
        with open(path) as fh:
            if fh.read() == text:
                return
    except (OSError, UnicodeDecodeError):
        pass
    write_atomic(path, text)


def _append_lines(path: str, records: list[dict]) -> None:
    """Append records, on disk before the caller rewrites the file they came from."""
    with open(path, "a") as fh:
        fh.write("".join(json.dumps(m) + "\n" for m in records))
        fh.flush()
        os.fsync(fh.fileno())


def new_run_dir(runs_dir: str, graph_name: str, run_name: str | None = None) -> RunDir:
    """A fresh directory: mkdir is atomic, so two runs started at once never share one."""
    base = run_name or f"{graph_name}-{time.strftime('%Y%m%d-%H%M%S')}"
    os.makedirs(runs_dir, exist_ok=True)
    for i in itertools.count(1):
        path = os.path.join(runs_dir, base if i == 1 else f"{base}-{i}")
        try:
            os.mkdir(path)
        except FileExistsError:
            continue
        return RunDir(path)


def newest_run_dir(runs_dir: str, graph_name: str) -> RunDir:
    candidates = [p for p in glob.glob(os.path.join(runs_dir, f"{graph_name}-*"))
                  if os.path.isfile(os.path.join(p, "config.yaml"))]
    if not candidates:
        raise FileNotFoundError(f"--resume: no earlier run of graph '{graph_name}' "
                                f"in {runs_dir!r}")
    return RunDir(max(candidates, key=os.path.getmtime))


def _jsonable(value):
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


def _optional(module: str, package: str):
    import importlib
    try:
        return importlib.import_module(module)
    except ImportError:
        raise RuntimeError(f"trainer.{package}=true needs the '{package}' package: "
                           f"pip install {package} (or hybridflow[tracking])") from None


class MetricSinks:
    """metrics.jsonl always; TensorBoard and W&B (offline) when enabled."""

    def __init__(self, run: RunDir, tensorboard: bool = False, wandb: bool = False,
                 name: str = "run"):
        self.run = run
        self.metrics = open(run.file("metrics.jsonl"), "a")
        self.timeline = open(run.file("timeline.jsonl"), "a")
        self.tb = self.wb = None
        if tensorboard:
            SummaryWriter = _optional("torch.utils.tensorboard", "tensorboard").SummaryWriter
            self.tb = SummaryWriter(run.file("tensorboard"))
        if wandb:
            wb = _optional("wandb", "wandb")
            os.environ.setdefault("WANDB_MODE", "offline")  # never send data unasked
            self.wb = wb.init(project="hybridflow", name=name, dir=run.path)

    def log(self, step: int, metrics: dict) -> None:
        record = {"step": step, **{k: _jsonable(v) for k, v in metrics.items()}}
        self.metrics.write(json.dumps(record) + "\n")
        self.metrics.flush()
        numeric = {k: v for k, v in metrics.items() if isinstance(v, (int, float))}
        if self.tb:
            for key, value in numeric.items():
                self.tb.add_scalar(key, value, step)
        if self.wb:
            self.wb.log(numeric, step=step)

    def log_timeline(self, step: int, records: list[dict]) -> None:
        # times from the step's first record; `origin` (that record's wall-clock time)
        # lays the steps of a streaming run on one time axis (draw/timeline.py)
        t0 = min((r["start"] for r in records), default=0.0)
        for r in records:
            row = {**r, "step": step, "start": r["start"] - t0, "end": r["end"] - t0,
                   "origin": t0}
            self.timeline.write(json.dumps(row) + "\n")
        self.timeline.flush()

    def close(self) -> None:
        # every line was flushed when logged: a close that fails (a full disk) has
        # nothing left to lose, and must not hide the error that stopped the run
        for fh in (self.metrics, self.timeline):
            with contextlib.suppress(OSError):
                fh.close()
        if self.tb:
            self.tb.close()
        if self.wb:
            self.wb.finish()
