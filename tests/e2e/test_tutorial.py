"""The custom graph in docs/tutorial.md works as written: it checks and trains (fast),
and learns (slow)."""
import os
import re

import pytest

from tests.support.e2e import REPO, series
from hybridflow.program.assemble import prepare
from hybridflow.run.loop import Trainer
from hybridflow.run.tracking import new_run_dir


def _tutorial_graph() -> str:
    text = open(os.path.join(REPO, "docs", "tutorial.md")).read()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    return next(b for b in blocks if b.startswith("# graphs/grpo_median.py"))


def _fit(tmp_path, *overrides):
    path = tmp_path / "grpo_median.py"
    path.write_text(_tutorial_graph())
    loaded = prepare(str(path), [f"trainer.runs_dir={tmp_path}", "trainer.progress=false",
                                 *overrides])
    run = new_run_dir(str(tmp_path), loaded.graph.name)
    trainer = Trainer(loaded, run)
    try:
        trainer.fit()
    finally:
        trainer.close()
    return trainer, run.read_metrics()


def test_tutorial_graph_checks_and_trains(tmp_path):
    trainer, metrics = _fit(tmp_path, "trainer.steps=2", "trainer.val_every=0")
    assert [m["step"] for m in metrics] == [1, 2]
    assert trainer.run.status()["state"] == "finished"
    fns = {n.name for n in trainer.plan.nodes if n.fn is not None}
    assert fns and all(f"timing_s/{name}" in metrics[-1] for name in fns), fns
    assert all("actor/pg_loss" in m for m in metrics)


@pytest.mark.slow  # 20 training steps (~20 s)
def test_tutorial_graph_learns(tmp_path):
    _, metrics = _fit(tmp_path, "trainer.steps=20", "trainer.val_every=20",
                      "trainer.val_samples=1")
    accuracy = series(metrics, "val/toy_arith/greedy")
    assert accuracy[-1] >= accuracy[0] + 0.3, accuracy
