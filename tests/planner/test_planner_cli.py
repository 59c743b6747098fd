"""`hybridflow plan` parses sizes and workload, prints a table or JSON, saves and draws."""
import json
import os

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

    monkeypatch.setattr("hybridflow.program.assemble.load_plan", load_plan)
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


def test_backend_offload_and_length_flags_reach_the_plan(capsys):
    code = main(["plan", "graphs/ppo.py", "--model", "70b", "--nodes", "4", "--offload", "all",
                 "--response-mean", "400", "--response-sigma", "0.8", "--json"])
    assert code == 0
    data = json.loads(capsys.readouterr().out)
    assert data["backend"]["offload"] == "all"
    assert data["workload"]["response_mean"] == 400
    assert data["workload"]["mini_batches"] == 8  # the paper's workload by default


def test_without_offload_70b_on_32_devices_does_not_fit(capsys):
    assert main(["plan", "graphs/ppo.py", "--model", "70b", "--nodes", "4"]) == 1
    assert "no placement fits" in capsys.readouterr().err


def test_megatron_backend_is_named_in_the_explanation(capsys):
    assert main(["plan", "graphs/ppo.py", "--model", "7b", "--train-backend", "megatron",
                 "--train-tp", "2"]) == 0
    assert "training megatron tp2 pp1" in capsys.readouterr().out


def test_a_graph_or_a_device_action_is_required(capsys):
    assert main(["plan"]) == 2
    assert "--measure-device" in capsys.readouterr().err


def test_a_measured_device_entry_is_saved_and_usable(tmp_path, monkeypatch, capsys):
    """The micro-benchmark itself is stubbed: this checks the plumbing, not this machine."""
    from hybridflow.planner import measure as measure_module
    monkeypatch.setenv("HYBRIDFLOW_DEVICES_DIR", str(tmp_path))
    fake = measure_module.Measurement(matmul_flops=5e10, memory_bandwidth=1e10,
                                      transfer_bandwidth=1e9, transfer_latency_s=2e-5,
                                      op_latency_s=5e-6, threads=1, layer_token_flops=1e10,
                                      decode_step_overhead_s=1e-3)
    monkeypatch.setattr(measure_module, "measure", lambda threads=1: fake)
    monkeypatch.setattr(measure_module, "host_memory_bytes", lambda: 256 * 2**30)
    assert main(["plan", "--measure-device", "--save", "box"]) == 0
    entry = json.loads((tmp_path / "box.json").read_text())
    assert entry["bf16_flops"] == 5e10 and entry["efficiency"]["mfu_forward"] == 0.2
    assert entry["provenance"]["measured"]["op_latency_s"] == 5e-6
    capsys.readouterr()
    assert main(["plan", "graphs/grpo.py", "--device", "box", "--nodes", "1",
                 "--gpus-per-node", "1", "--model", "0.5b", "--prompts", "16",
                 "--prompt-len", "8", "--response-len", "4", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["cluster"]["device"] == "box"


def test_plan_with_staleness_plans_pipelined_steps_and_weighs_the_rollout_apart(
        monkeypatch, capsys):
    monkeypatch.undo()  # the real graph file: the compiler splits it into sides
    grpo = os.path.join(os.path.dirname(__file__), "..", "..", "graphs", "grpo.py")
    code = main(["plan", grpo, "--model", "7b", "--nodes", "2", "--prompts", "128",
                 "--samples", "8", "--prompt-len", "512", "--response-len", "4096",
                 "--response-mean", "1000", "--json", "trainer.staleness=1",
                 "trainer.allow_uncorrected_async=true"])
    data = json.loads(capsys.readouterr().out)
    assert code == 0
    assert data["pipeline"]["staleness"] == 1
    assert data["pipeline"]["movable"] == {"rollout.generate": "rollout"}
    assert "actor.update" not in data["pipeline"]["rollout_side"]
    best = data["best"]
    assert best["pipeline"]["own_weights"] == {"rollout": "actor"}
    assert best["placement"]["roles"]["rollout"] != best["placement"]["roles"]["actor"]
    assert {"weight_export", "weight_sync"} <= set(best["nodes"])


def test_plan_rollout_call_feeds_the_engine_in_calls_and_says_so(capsys):
    args = ["plan", "graphs/ppo.py", "--model", "7b", "--nodes", "2", "--response-mean", "512",
            "--top-k", "1"]
    assert main(args) == 0
    one_call = capsys.readouterr().out
    assert main(args + ["--rollout-call", "16"]) == 0
    in_calls = capsys.readouterr().out
    assert "rollout fed 16 sequences a call" in in_calls and "a call" not in one_call
    with pytest.raises(SystemExit) as usage:  # a usage error, from the option's range
        main(args + ["--rollout-call", "-1"])
    assert usage.value.code == 2
    assert "argument --rollout-call: -1 is too small: at least 0" in capsys.readouterr().err
