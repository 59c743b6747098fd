"""The custom graph in docs/tutorial.md works as written: it checks and learns."""
import os
import re

from tests.support.e2e import REPO, series
from hybridflow.program.assemble import prepare
from hybridflow.run.loop import Trainer
from hybridflow.run.tracking import new_run_dir


def _tutorial_graph() -> str:
    text = open(os.path.join(REPO, "docs", "tutorial.md")).read()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    return next(b for b in blocks if b.startswith("# graphs/grpo_median.py"))


def test_tutorial_graph_runs_and_learns(tmp_path):
    path = tmp_path / "grpo_median.py"
    path.write_text(_tutorial_graph())
    loaded = prepare(str(path), [f"trainer.runs_dir={tmp_path}", "trainer.progress=false",
                                 "trainer.steps=20", "trainer.val_every=20",
                                 "trainer.val_samples=1"])
    run = new_run_dir(str(tmp_path), loaded.graph.name)
    trainer = Trainer(loaded, run)
    try:
        trainer.fit()
    finally:
        trainer.close()
    accuracy = series(run.read_metrics(), "val/toy_arith/greedy")
    assert accuracy[-1] >= accuracy[0] + 0.3, accuracy
