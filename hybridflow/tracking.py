"""A run's directory and what is written to it as the run goes.

runs/<graph>-<time>/
  config.yaml       the merged config
  metrics.jsonl     one line per step (appended to on resume)
  timeline.jsonl    per-node start/end of each step, for `hybridflow render --timeline`
  status.json       running / finished / failed, with the reason
  checkpoints/      see hybridflow/checkpoint.py
"""
from __future__ import annotations

import glob
import json
import math
import os
import time

from omegaconf import DictConfig, OmegaConf

__all__ = ["RunDir", "new_run_dir", "newest_run_dir", "MetricSinks"]


class RunDir:
    def __init__(self, path: str):
        self.path = path
        os.makedirs(path, exist_ok=True)

    def file(self, name: str) -> str:
        return os.path.join(self.path, name)

    @property
    def checkpoints(self) -> str:
        return self.file("checkpoints")

    def save_config(self, cfg: DictConfig) -> None:
        OmegaConf.save(cfg, self.file("config.yaml"))

    def set_status(self, state: str, **info) -> None:
        record = {"state": state, "time": time.time(), **info}
        tmp = self.file("status.json.tmp")
        with open(tmp, "w") as fh:
            json.dump(record, fh, indent=1)
        os.replace(tmp, self.file("status.json"))

    def status(self) -> dict:
        try:
            with open(self.file("status.json")) as fh:
                return json.load(fh)
        except FileNotFoundError:
            return {}

    def read_metrics(self) -> list[dict]:
        try:
            with open(self.file("metrics.jsonl")) as fh:
                return [json.loads(line) for line in fh if line.strip()]
        except FileNotFoundError:
            return []

    def truncate_metrics(self, last_step: int) -> None:
        """On resume, drop the metric and timeline lines of steps after the checkpoint
        (they will be redone); -1 drops them all, step 0's validation included."""
        for name in ("metrics.jsonl", "timeline.jsonl"):
            try:
                with open(self.file(name)) as fh:
                    lines = [json.loads(line) for line in fh if line.strip()]
            except FileNotFoundError:
                continue
            with open(self.file(name), "w") as fh:
                for m in lines:
                    if m.get("step", 0) <= last_step:
                        fh.write(json.dumps(m) + "\n")


def new_run_dir(runs_dir: str, graph_name: str, run_name: str | None = None) -> RunDir:
    base = run_name or f"{graph_name}-{time.strftime('%Y%m%d-%H%M%S')}"
    path, i = os.path.join(runs_dir, base), 1
    while os.path.exists(path):
        i += 1
        path = os.path.join(runs_dir, f"{base}-{i}")
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
        t0 = min((r["start"] for r in records), default=0.0)
        for r in records:
            row = {**r, "step": step, "start": r["start"] - t0, "end": r["end"] - t0}
            self.timeline.write(json.dumps(row) + "\n")
        self.timeline.flush()

    def close(self) -> None:
        self.metrics.close()
        self.timeline.close()
        if self.tb:
            self.tb.close()
        if self.wb:
            self.wb.finish()
