"""Every graph file in graphs/ checks, renders, and (for the RL ones) learns the toy
task from the shipped base model on the local runtime: held-out greedy accuracy
rises by at least 0.3. The agent graphs (agent_grpo, agent_sft) check and render
here; they train on the calculator task, not the toy one, so agent_grpo's learning
run is tests/e2e/test_agent_grpo.py (local and Ray)."""
import glob
import os

import pytest

from hybridflow.cli import main
from tests.support.e2e import REPO, series, train

GRAPHS = sorted(os.path.splitext(os.path.basename(p))[0]
                for p in glob.glob(os.path.join(REPO, "graphs", "*.py"))
                if not os.path.basename(p).startswith(("_", "ops", "common")))
VAL = "val/toy_arith/greedy"


def test_the_graph_list_is_complete():
    assert {"grpo", "ppo", "rloo", "reinforce_pp", "remax", "dapo", "sft"} <= set(GRAPHS)


@pytest.mark.parametrize("name", GRAPHS)
def test_check_and_render(name, tmp_path, capsys):
    path = os.path.join(REPO, "graphs", f"{name}.py")
    assert main(["check", path]) == 0
    assert main(["render", path, "-o", str(tmp_path / "g.dot")]) == 0
    assert main(["render", path, "--plan", "-o", str(tmp_path / "p.dot")]) == 0
    assert f"{name}" in (tmp_path / "g.dot").read_text()


@pytest.mark.parametrize("name", ["ppo", "rloo", "reinforce_pp", "remax", "dapo"])
def test_default_run_learns(name, tmp_path):
    _, metrics = train(name, tmp_path, "trainer.steps=20", "trainer.val_every=20",
                       "trainer.val_samples=1")
    accuracy = series(metrics, VAL)
    assert accuracy[-1] >= accuracy[0] + 0.3, (name, accuracy)
    if name == "dapo":  # dynamic sampling reports what it dropped and drew
        assert "dapo/dropped_groups_total" in metrics[-1]
        assert "gather/extra_rounds" in metrics[-1]
