"""`hybridflow plan` parses sizes and workload, prints a table or JSON, saves and draws."""
import json

import pytest
import yaml
from planner_graphs import ppo_graph

from hybridflow.cli import main
from hybridflow.planner import ModelSpec


@pytest.fixture(autouse=True)
def tiny_graph(monkeypatch):
    """The CLI loads graph files through load_plan; these tests stand in the PPO test graph."""
    seen = {}

    def load_plan(path, overrides, **_):
        seen.update(path=path, overrides=overrides)
        return ppo_graph()

    monkeypatch.setattr("hybridflow.program.load_plan", load_plan)
    return seen


def test_plan_prints_a_table_and_passes_overrides(tiny_graph, capsys):
    code = main(["plan", "graphs/ppo.py", "--nodes", "2", "--device", "h100", "--model", "7b",
                 "rollout.n=4"])
    out = capsys.readouterr().out
    assert code == 0
    assert "on 2 node(s) x 8 H100-80G" in out and "Best plan:" in out
    assert tiny_graph == {"path": "graphs/ppo.py", "overrides": ["rollout.n=4"]}
    assert "reward need no device" in out  # a bare size skips the rule role


def test_plan_json_with_per_role_sizes(capsys):
    code = main(["plan", "g.py", "--model", "13b", "--model", "critic=7b,reward=7b", "--json",
                 "--top-k", "2"])
    data = json.loads(capsys.readouterr().out)
    assert code == 0
    assert data["models"]["actor"]["name"] == "13b" and data["models"]["critic"]["name"] == "7b"
    assert "reward" in data["models"] and len(data["candidates"]) == 1


def test_plan_saves_placement_and_draws(tmp_path, capsys):
    saved, drawn = tmp_path / "placement.yaml", tmp_path / "plan.dot"
    assert main(["plan", "g.py", "--save", str(saved), "--render", str(drawn)]) == 0
    placement = yaml.safe_load(saved.read_text())["placement"]
    assert set(placement) == {"pools", "roles", "parallel"}
    assert "digraph" in drawn.read_text()


def test_model_from_hf_config_file(tmp_path, capsys):
    config = {"hidden_size": 2048, "num_hidden_layers": 16, "num_attention_heads": 16,
              "intermediate_size": 5504, "vocab_size": 32000}
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert main(["plan", "g.py", "--model", str(tmp_path), "--json"]) == 0
    actor = json.loads(capsys.readouterr().out)["models"]["actor"]
    assert actor["params"] == ModelSpec.from_hf_config(config).params
    assert actor["name"] == tmp_path.name  # named after the model's directory


def test_errors_exit_non_zero_with_a_message(capsys):
    assert main(["plan", "g.py", "--model", "70b", "--nodes", "1"]) == 1
    assert "no placement fits" in capsys.readouterr().err
    assert main(["plan", "g.py", "--model", "policy=7b"]) == 2
    assert "does not have" in capsys.readouterr().err
    assert main(["plan", "g.py", "--device", "tpu"]) == 2
    assert "unknown device" in capsys.readouterr().err
