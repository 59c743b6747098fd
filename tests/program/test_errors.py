"""Bad input, caught early: each malformed input gives one clear message naming the
key, node, file or row, exit code 1 from `hybridflow run` with no traceback, and no
worker started (docs/errors.md lists every error; this file holds the ones that the
module tests do not: test_compiler, test_config, test_cli_check, test_data, workers/).

Checks made by `prepare` (config.py `_check_consistency`, hybridflow/program/preflight.py)
run before the Trainer exists; dataset rows are read by the Trainer before it
starts the runtime. The `no_workers` fixture fails a test whose run got that far.
"""
from __future__ import annotations

import os
import shutil
import sys
import textwrap

import pytest

from hybridflow.cli import main
from hybridflow.program.assemble import prepare
from hybridflow.program.config import ConfigError

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GRPO = os.path.join(REPO, "graphs", "grpo.py")
PPO = os.path.join(REPO, "graphs", "ppo.py")
TOY_BASE = os.path.join(REPO, "graphs", "assets", "toy_base")


@pytest.fixture(autouse=True)
def no_workers(monkeypatch):
    """Every error here must come before the runtime starts a worker."""
    def refuse(*args, **kwargs):
        pytest.fail("a runtime (and its workers) started before the error was caught")
    monkeypatch.setattr("hybridflow.run.loop.make_runtime", refuse)


def run(capsys, tmp_path, *argv, graph=GRPO) -> str:
    """`hybridflow run` with the runs under tmp_path; asserts exit 1, returns stderr."""
    code = main(["run", graph, f"trainer.runs_dir={tmp_path / 'runs'}",
                 "trainer.progress=false", *argv])
    err = capsys.readouterr().err
    assert code == 1, err
    assert err.startswith("hybridflow run: "), err
    assert "Traceback" not in err, err
    return err


def write(path, text: str) -> str:
    path.write_text(textwrap.dedent(text))
    return str(path)


# ------------------------------------------------------------------ config
@pytest.mark.parametrize("override, words", [
    ("rollout.n=0", "rollout.n must be at least 1, got 0"),
    ("data.max_prompt_length=0", "data.max_prompt_length must be at least 1"),
    ("actor.mini_batch_size=0", "actor.mini_batch_size must be at least 1, got 0"),
    ("actor.lr=-0.001", "actor.lr must not be negative, got -0.001"),
    ("actor.ppo_epochs=0", "actor.ppo_epochs must be at least 1, got 0"),
    ("actor.policy_loss=ppo2", r"actor.policy_loss='ppo2' is not a known policy loss; "
                               r"did you mean 'ppo'\? \(valid: cispo, gspo, ppo\)"),
    ("actor.loss_agg_mode=token_mean", r"actor.loss_agg_mode='token_mean' is not a known loss "
                                       r"aggregation mode; did you mean 'token-mean'"),
    ("actor.kl_loss_type=k5", r"actor.kl_loss_type='k5' is not a known KL kind"),
    ("rollout.backend=sglang", r"rollout.backend='sglang' is not a known rollout backend "
                               r"\(valid: hf, vllm\)"),
    ("actor.strategy=deepspeed", r"actor.strategy='deepspeed' is not a known training strategy"),
    ("actor.lr_schedule=linear", r"actor.lr_schedule='linear' is not a known lr schedule"),
    ("model.dtype=float8", r"model.dtype: unknown model dtype 'float8'; use one of"),
])
def test_inconsistent_or_unknown_config_values(capsys, tmp_path, override, words):
    import re
    err = run(capsys, tmp_path, override)
    assert re.search(words, err), err


def test_critic_settings_are_checked_too(capsys, tmp_path):
    err = run(capsys, tmp_path, "critic.lr=-1", graph=PPO)
    assert "critic.lr must not be negative" in err
    err = run(capsys, tmp_path, "critic.loss_agg_mode=mean", graph=PPO)
    assert "critic.loss_agg_mode='mean' is not a known loss aggregation mode" in err


def test_unknown_kl_kind_in_the_graphs_algorithm_section(capsys, tmp_path):
    # graphs/ppo.py declares its algorithm section (ALGORITHM): refused with the config
    err = run(capsys, tmp_path, "algorithm.kl_kind=k9", graph=PPO)
    assert "algorithm.kl_kind='k9' is not a known KL kind" in err
    assert "valid: k1," in err


# --------------------------------------------------- batch vs. the DP ranks
def test_a_batch_too_small_for_the_data_parallel_ranks(capsys, tmp_path):
    err = run(capsys, tmp_path, "runtime.name=ray", "placement.pools.main.devices_per_node=4",
              "data.batch_size=2", "rollout.n=8", "actor.mini_batch_size=16",
              "actor.micro_batch_size=16")
    assert ("data.batch_size=2 prompts cannot feed the role 'rollout' (pool 'main', 4 "
            "data-parallel ranks)") in err
    assert "at least 4" in err


def test_a_mini_batch_that_does_not_split_over_the_ranks(capsys, tmp_path):
    err = run(capsys, tmp_path, "runtime.name=ray", "placement.pools.main.devices_per_node=4",
              "data.batch_size=8", "rollout.n=4", "actor.mini_batch_size=30",
              "actor.micro_batch_size=8")
    assert ("actor.mini_batch_size=30 does not split evenly over the role 'actor' (pool "
            "'main', 4 data-parallel ranks); use a multiple of 4") in err


def test_the_local_runtime_refuses_to_train_on_two_ranks_before_starting(capsys, tmp_path):
    err = run(capsys, tmp_path, "placement.pools.main.devices_per_node=2")
    assert "the local runtime cannot train role 'actor' on the 2 ranks of pool 'main'" in err
    assert "--runtime ray" in err


def test_a_valid_data_parallel_batch_passes_the_preflight():
    loaded = prepare(GRPO, ["runtime.name=ray", "placement.pools.main.devices_per_node=4",
                            "data.batch_size=8", "rollout.n=4", "actor.mini_batch_size=32",
                            "actor.micro_batch_size=8"])
    assert loaded.plan.placement.pools["main"].world_size == 4


# ------------------------------------------------------------------ models
def test_model_path_that_does_not_exist(capsys, tmp_path):
    err = run(capsys, tmp_path, f"model.path={tmp_path / 'nope'}")
    assert f"model.path '{tmp_path / 'nope'}' is not a local directory" in err


def test_model_path_that_is_a_hub_id(capsys, tmp_path):
    err = run(capsys, tmp_path, "model.path=Qwen/Qwen2.5-0.5B")
    assert "model.path 'Qwen/Qwen2.5-0.5B' is not a local directory" in err
    assert "does not download" in err and "huggingface-cli download Qwen/Qwen2.5-0.5B" in err


def test_model_directory_without_config_json(capsys, tmp_path):
    (tmp_path / "weights").mkdir()
    err = run(capsys, tmp_path, f"model.path={tmp_path / 'weights'}")
    assert f"model.path '{tmp_path / 'weights'}' has no config.json" in err


def test_model_directory_without_weights(capsys, tmp_path):
    (tmp_path / "cfg_only").mkdir()
    shutil.copy(os.path.join(TOY_BASE, "config.json"), tmp_path / "cfg_only")
    err = run(capsys, tmp_path, f"model.path={tmp_path / 'cfg_only'}")
    assert "has a config.json but no weights (*.safetensors or *.bin)" in err


def test_model_path_that_is_a_file(capsys, tmp_path):
    err = run(capsys, tmp_path, f"model.path={TOY_BASE}/model.safetensors")
    assert "model.path" in err and "is a file; give the directory that holds it" in err


@pytest.mark.parametrize("key", ["ref.path", "critic.path", "reward.model_path"])
def test_other_model_paths_are_checked(capsys, tmp_path, key):
    err = run(capsys, tmp_path, f"{key}={tmp_path / 'missing'}")
    assert f"{key} '{tmp_path / 'missing'}' is not a local directory" in err


def test_tokenizer_directory_that_does_not_exist(capsys, tmp_path):
    err = run(capsys, tmp_path, f"model.tokenizer={tmp_path / 'tok'}")
    assert f"model.tokenizer '{tmp_path / 'tok'}' is not a local directory" in err


# ------------------------------------------------------------------ reward
@pytest.fixture
def scorers(tmp_path):
    return {
        "no_function": write(tmp_path / "no_function.py", """
            def score(data_source, solution_str, ground_truth, extra_info=None):
                return 0.0
        """),
        "wrong_signature": write(tmp_path / "wrong_signature.py", """
            def compute_score(text):
                return 0.0
        """),
        "broken": write(tmp_path / "broken.py", "def compute_score(:\n"),
    }


def test_reward_function_file_that_does_not_exist(capsys, tmp_path):
    err = run(capsys, tmp_path, f"reward.function_path={tmp_path / 'nope.py'}")
    assert f"reward.function_path='{tmp_path / 'nope.py'}'" in err
    assert "scorer file not found" in err


def test_reward_file_without_the_function(capsys, tmp_path, scorers):
    err = run(capsys, tmp_path, f"reward.function_path={scorers['no_function']}")
    assert "reward.function_name='compute_score'" in err
    assert "defines no 'compute_score'; functions defined there: score" in err


def test_reward_function_with_a_wrong_signature(capsys, tmp_path, scorers):
    err = run(capsys, tmp_path, f"reward.function_path={scorers['wrong_signature']}")
    assert "has signature (text), but a scorer must accept (data_source, solution_str" in err


def test_reward_file_that_does_not_import(capsys, tmp_path, scorers):
    err = run(capsys, tmp_path, f"reward.function_path={scorers['broken']}")
    assert "scorer file" in err and "broken.py' failed to import: SyntaxError" in err


# -------------------------------------------------------------------- data
def test_train_file_that_does_not_exist(capsys, tmp_path):
    err = run(capsys, tmp_path, f"data.train_files={tmp_path / 'train.jsonl'}")
    assert f"data.train_files: data file '{tmp_path / 'train.jsonl'}' does not exist" in err


def test_train_file_of_an_unknown_format(capsys, tmp_path):
    path = tmp_path / "train.csv"
    path.write_text("prompt,data_source\n1+1=,toy_arith\n")
    err = run(capsys, tmp_path, f"data.train_files={path}")
    assert f"data file '{path}' has an unknown format: use .jsonl" in err


def test_empty_train_file(capsys, tmp_path):
    path = tmp_path / "train.jsonl"
    path.write_text("")
    err = run(capsys, tmp_path, f"data.train_files={path}")
    assert f"data.train_files: data file '{path}' is empty" in err


def test_val_file_that_does_not_exist(capsys, tmp_path):
    train = tmp_path / "train.jsonl"
    train.write_text('{"prompt": "1+1=", "data_source": "toy_arith", '
                     '"reward_model": {"ground_truth": "2"}}\n')
    err = run(capsys, tmp_path, f"data.train_files={train}",
              f"data.val_files={tmp_path / 'val.parquet'}")
    assert f"data.val_files: data file '{tmp_path / 'val.parquet'}' does not exist" in err


def test_a_bad_row_is_reported_before_any_worker_starts(capsys, tmp_path):
    path = tmp_path / "train.jsonl"
    path.write_text('{"prompt": "1+1=", "data_source": "toy_arith", '
                    '"reward_model": {"ground_truth": "2"}}\n{"prompt": \n')
    err = run(capsys, tmp_path, f"data.train_files={path}", "data.batch_size=1", "rollout.n=8",
              "actor.mini_batch_size=8", "actor.micro_batch_size=8")
    assert f"could not start: data file '{path}' line 2 is not valid JSON" in err


def test_a_data_source_no_scorer_knows_is_reported_before_any_worker_starts(capsys, tmp_path):
    path = tmp_path / "train.jsonl"
    path.write_text('{"prompt": "1+1=", "data_source": "toy_arithmetic", '
                    '"reward_model": {"ground_truth": "2"}}\n')
    err = run(capsys, tmp_path, f"data.train_files={path}", "data.batch_size=1", "rollout.n=8",
              "actor.mini_batch_size=8", "actor.micro_batch_size=8")
    assert f"{path} row 0: no built-in scorer for data_source 'toy_arithmetic'" in err


def test_runtime_local_with_an_address_is_a_contradiction(capsys, tmp_path):
    err = run(capsys, tmp_path, "--runtime", "local", "--address", "10.0.0.1:6379")
    assert "--runtime local and --address 10.0.0.1:6379 contradict each other" in err


# ------------------------------------------------------------------ resume
def test_resume_of_a_directory_that_is_not_a_run(capsys, tmp_path):
    (tmp_path / "somewhere").mkdir()
    code = main(["run", GRPO, f"trainer.runs_dir={tmp_path}", "--resume",
                 str(tmp_path / "somewhere")])
    err = capsys.readouterr().err
    assert code == 1
    assert f"--resume {tmp_path / 'somewhere'}: not a run directory (no config.yaml)" in err


def test_resume_with_no_earlier_run(capsys, tmp_path):
    code = main(["run", GRPO, f"trainer.runs_dir={tmp_path}", "--resume"])
    err = capsys.readouterr().err
    assert code == 1
    assert f"--resume: no earlier run of graph 'grpo' in '{tmp_path}'" in err


def test_resume_of_a_run_name_with_no_run(capsys, tmp_path):
    code = main(["run", GRPO, f"trainer.runs_dir={tmp_path}", "trainer.run_name=exp1",
                 "--resume"])
    err = capsys.readouterr().err
    assert code == 1
    assert f"--resume: no run named 'exp1' in '{tmp_path}'" in err


# ------------------------------------------- user code only from named paths
def test_a_graph_is_a_file_path_never_a_module_name(capsys, tmp_path):
    code = main(["check", "graphs.grpo"])  # importable as a module, but not a file
    assert code == 1
    assert "graph file 'graphs.grpo' does not exist" in capsys.readouterr().err


def test_files_beside_the_graph_are_not_imported(capsys, tmp_path, monkeypatch):
    marker = tmp_path / "imported"
    write(tmp_path / "helpers_mod.py", f"open({str(marker)!r}, 'w').close()\n")
    graph = write(tmp_path / "g.py", """
        from graphs.grpo import build, defaults
    """)
    before = list(sys.path)
    monkeypatch.chdir(tmp_path)
    assert main(["check", graph]) == 0
    assert not marker.exists() and "helpers_mod" not in sys.modules
    assert sys.path == before  # the graph's directory is not put on the import path


def test_a_reward_function_is_a_file_path_never_a_module_name(capsys, tmp_path, monkeypatch):
    write(tmp_path / "my_scorer.py", """
        def compute_score(data_source, solution_str, ground_truth, extra_info=None):
            return 1.0
    """)
    monkeypatch.syspath_prepend(str(tmp_path))  # `import my_scorer` would succeed
    err = run(capsys, tmp_path, "reward.function_path=my_scorer")
    assert "scorer file not found: my_scorer" in err


def test_check_catches_path_errors_too(capsys, tmp_path):
    assert main(["check", GRPO, f"model.path={tmp_path / 'nope'}"]) == 1
    assert "model.path" in capsys.readouterr().err


def test_render_and_plan_do_not_need_the_paths_to_exist(tmp_path):
    from hybridflow.program.assemble import load_plan
    plan = load_plan(GRPO, [f"model.path={tmp_path / 'on-the-cluster'}"])
    assert plan.nodes


def test_prepare_raises_config_errors_for_the_preflight(tmp_path):
    with pytest.raises(ConfigError, match="data.train_files"):
        prepare(GRPO, [f"data.train_files={tmp_path / 'x.jsonl'}"])


# --------------------------------------------------------------- safe defaults
def test_a_ray_instance_the_run_starts_has_no_dashboard(monkeypatch):
    ray_pools = pytest.importorskip("hybridflow.runtime.ray.pools")
    from hybridflow.plan.placement import Placement
    calls = []
    monkeypatch.setattr(ray_pools.ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray_pools.ray, "init", lambda **kw: calls.append(kw))
    placement = Placement.from_config({"pools": {"main": {"nodes": 1, "devices_per_node": 1}},
                                       "roles": {"actor": "main"}})
    settings = ray_pools.RuntimeSettings()
    assert ray_pools.connect(settings, placement) is True
    (kwargs,) = calls
    assert kwargs.get("include_dashboard") is False or \
        kwargs.get("dashboard_host") == "127.0.0.1", kwargs

