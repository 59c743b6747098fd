"""Every graph file in graphs/ checks, renders, and (for the RL ones) trains two steps
running every node (the fast tier) and learns the toy task from the shipped base
model on the local runtime: held-out greedy accuracy rises by at least 0.3 (slow).
The agent graphs (agent_grpo, agent_sft) check and render here; they train on the
calculator task, not the toy one, so agent_grpo's learning run is
tests/e2e/test_agent_grpo.py (local and Ray)."""
import glob
import os

import pytest

from hybridflow.cli import main
from hybridflow.core.kinds import Op
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


RL_GRAPHS = ["ppo", "rloo", "reinforce_pp", "remax", "dapo"]
# what each graph's own nodes report, beside the actor's update
OWN_METRICS = {"ppo": ("critic/vf_loss",), "dapo": ("dapo/dropped_groups_total",
                                                   "gather/extra_rounds")}


@pytest.mark.parametrize("name", RL_GRAPHS)
def test_default_run_trains_every_node(name, tmp_path):
    """The fast tier's run of each graph (test_learning.py's GRPO run is the one that
    learns there): two steps, every node run, the run finished."""
    trainer, metrics = train(name, tmp_path, "trainer.steps=2", "trainer.val_every=0")
    assert [m["step"] for m in metrics] == [1, 2]
    assert trainer.run.status()["state"] == "finished"
    for key in ("actor/pg_loss", *OWN_METRICS.get(name, ())):
        assert all(key in m for m in metrics), (name, key)
    ran = {k.removeprefix("timing_s/") for k in metrics[-1] if k.startswith("timing_s/")}
    calls = {n.name for n in trainer.plan.nodes if n.op is Op.CALL}
    assert calls <= ran, (name, calls - ran)


@pytest.mark.slow  # 20 training steps and a validation each (~8 s)
@pytest.mark.parametrize("name", RL_GRAPHS)
def test_default_run_learns(name, tmp_path):
    _, metrics = train(name, tmp_path, "trainer.steps=20", "trainer.val_every=20",
                       "trainer.val_samples=1")
    accuracy = series(metrics, VAL)
    assert accuracy[-1] >= accuracy[0] + 0.3, (name, accuracy)
