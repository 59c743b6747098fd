"""`hybridflow check` and `render --plan` say which model each role loads and which
function nodes keep state (hybridflow/program/provenance.py)."""
from __future__ import annotations

import os

from hybridflow.cli import main
from hybridflow.program.assemble import prepare
from hybridflow.program.provenance import provenance_lines

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PPO = os.path.join(REPO, "graphs", "ppo.py")
TOY_BASE = os.path.join(REPO, "graphs", "assets", "toy_base")


def test_each_role_names_the_weights_it_loads():
    loaded = prepare(PPO, [f"critic.path={TOY_BASE}", "reward.function_path=my_reward.py"],
                     preflight=False)
    text = "\n".join(provenance_lines(loaded.cfg, loaded.plan))
    assert f"actor: {loaded.cfg.model.path} (model.path)" in text
    assert f"ref: {loaded.cfg.model.path} (ref.path unset: the initial policy)" in text
    assert f"critic: {TOY_BASE} (critic.path) with a new value head" in text
    assert "reward: rule scorer compute_score from my_reward.py (reward.function_path)" in text


def test_a_model_built_from_config_and_weighted_scorers_are_named():
    loaded = prepare(PPO, ["model.path=null", "reward.scorers.exact.weight=2",
                           "reward.scorers.short.function_path=len.py"], preflight=False)
    text = "\n".join(provenance_lines(loaded.cfg, loaded.plan))
    assert "actor: new random weights from model.hf_config" in text
    assert "reward: rule scorers exact=2 x built-in compute_score, short=1 x " \
           "compute_score from len.py" in text


def test_stateful_nodes_are_listed(capsys):
    code = main(["check", PPO, "algorithm.kl_target=6"])
    out = capsys.readouterr().out
    assert code == 0
    assert "keep state across steps (checkpointed): kl_in_reward" in out
    assert "actor: " in out


def test_render_plan_prints_the_provenance_too(capsys, tmp_path):
    code = main(["render", PPO, "-o", str(tmp_path / "ppo.dot"), "--plan"])
    out = capsys.readouterr().out
    assert code == 0 and "weights:" in out and "  critic: " in out
