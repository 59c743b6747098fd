"""Running a graph file end to end from tests, as `hybridflow run` does."""
from __future__ import annotations

import os

import torch

from hybridflow.program.assemble import prepare
from hybridflow.run.loop import Trainer
from hybridflow.run.tracking import RunDir, new_run_dir

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
torch.set_num_threads(1)  # 2-core machines: the test process is one of several


def graph_file(name: str) -> str:
    return os.path.join(REPO, "graphs", f"{name}.py")


def train(name: str, tmp_path, *overrides: str,
          resume: str | None = None) -> tuple[Trainer, list[dict]]:
    """Run graphs/<name>.py with overrides; returns the trainer and its metric lines."""
    loaded = prepare(graph_file(name), [f"trainer.runs_dir={tmp_path}", "trainer.progress=false",
                                        *overrides])
    run = RunDir(resume) if resume else new_run_dir(str(tmp_path), loaded.graph.name)
    run.save_config(loaded.cfg)
    trainer = Trainer(loaded, run, resume_from=resume)
    try:
        trainer.fit()
    finally:
        trainer.close()
    return trainer, run.read_metrics()


def series(metrics: list[dict], key: str) -> list[float]:
    return [m[key] for m in metrics if key in m]


class SharedRuns:
    """Training runs that tests in several modules assert on, trained once per test
    process (the `shared_runs` fixture): GRPO's 30-step local run, say, is both
    test_learning's check that GRPO learns and test_rollout_placement's colocated
    baseline. A run is keyed by its graph and its overrides as a set, so the
    overrides must name distinct keys; a Ray run trains in the Ray session of the
    test that asks first. Tests only read what a shared run wrote."""

    def __init__(self, root):
        self.root, self.done = root, {}

    def train(self, name: str, *overrides: str) -> tuple[Trainer, list[dict]]:
        keys = [o.split("=", 1)[0] for o in overrides]
        assert len(set(keys)) == len(keys), f"overrides name a key twice: {overrides}"
        key = (name, frozenset(overrides))
        if key not in self.done:
            self.done[key] = train(name, self.root / f"run{len(self.done)}", *overrides)
        return self.done[key]
