"""Issue 36, item 3: `check` is `run` without the workers. One table of what `run`
refuses before any worker starts; every row is driven through both commands, which
must refuse it with the same line (only the command's name differs) and exit 1, and
`run` must have started nothing (no run directory, no Trainer). Rows `run` accepts
reach the Trainer, which the test replaces by one that says so."""
from __future__ import annotations

import json
import os

import pytest

from hybridflow.cli import main
from tests.support.recorded_runs import graph_path

GRPO = graph_path("grpo.py")
RAY_TWO = ("runtime.name=ray", "placement.pools.main.devices_per_node=2",
           "actor.strategy=fsdp2")
STREAM = ("trainer.async_mode=streaming", "trainer.staleness=1", "actor.off_policy=tis")


class Launched(Exception):
    """Raised where `run` would start its workers."""


class _NoTrainer:
    def __init__(self, *args, **kwargs):
        raise Launched("launched")


@pytest.fixture
def gpt2_dirs(tmp_path):
    """GPT-2 model directories (GPT-2's config names: n_embd, n_layer, n_head), one
    with 4 heads and one with 3, a directory whose config names no shapes, a Llama asking
    for an attention sequence parallelism does not wrap and a sliding-window Qwen2."""
    from safetensors.torch import save_file
    import torch
    dirs = {}
    for name, config in {
        "gpt2": {"model_type": "gpt2", "n_embd": 32, "n_layer": 2, "n_head": 4,
                 "vocab_size": 64, "n_positions": 128},
        "gpt2_3heads": {"model_type": "gpt2", "n_embd": 24, "n_layer": 2, "n_head": 3,
                        "vocab_size": 64, "n_positions": 128},
        "shapeless": {"model_type": "mystery", "vocab_size": 64, "n_positions": 128},
        "llama_flex": {"model_type": "llama", "hidden_size": 32, "num_hidden_layers": 2,
                       "num_attention_heads": 4, "num_key_value_heads": 2,
                       "intermediate_size": 64, "vocab_size": 64,
                       "attn_implementation": "flex_attention"},
        "llama_4kv": {"model_type": "llama", "hidden_size": 32, "num_hidden_layers": 2,
                      "num_attention_heads": 4, "num_key_value_heads": 4,
                      "intermediate_size": 64, "vocab_size": 64},
        "qwen2_sliding": {"model_type": "qwen2", "hidden_size": 32, "num_hidden_layers": 2,
                          "num_attention_heads": 4, "num_key_value_heads": 2,
                          "intermediate_size": 64, "vocab_size": 64,
                          "use_sliding_window": True, "sliding_window": 16},
    }.items():
        path = tmp_path / name
        path.mkdir()
        (path / "config.json").write_text(json.dumps(config))
        save_file({"w": torch.zeros(1)}, str(path / "model.safetensors"))
        dirs[name] = str(path)
    return dirs


# (id, argv after the graph, words the one line holds); `{gpt2}`-style fields name
# the fixture's model directories
REFUSED = [
    ("gpt2 heads", ("model.path={gpt2_3heads}", "model.tokenizer=char",
                    "placement.parallel.actor.tp=2", *RAY_TWO),
     ["placement.parallel.actor.tp=2", "num_attention_heads=3"]),
    ("gpt2 tp plan", ("model.path={gpt2}", "model.tokenizer=char",
                      "placement.parallel.actor.tp=2", *RAY_TWO),
     ["placement.parallel.actor.tp=2 (model.path", "'gpt2' ships no tensor-parallel plan"]),
    ("shapeless model", ("model.path={shapeless}", "model.tokenizer=char"),
     ["model.path", "lacks hidden_size (n_embd", "num_attention_heads (n_head"]),
    ("misspelt parallel role", ("placement.parallel.actr.tp=2", *RAY_TWO),
     ["placement.parallel.actr", "no role 'actr'", "did you mean 'actor'"]),
    ("misspelt placed role", ("placement.roles.refr=main",),
     ["placement.roles.refr", "no role 'refr'", "did you mean 'ref'"]),
    ("misspelt pool", ("placement.roles.critic=mian",),
     ["placement.roles.critic='mian'", "no pool 'mian'", "did you mean 'main'"]),
    ("streaming hf tp", (*STREAM, "placement.parallel.actor.tp=2", *RAY_TWO),
     ["trainer.async_mode=streaming", "placement.parallel.actor.tp=2",
      "trainer.async_mode=pipeline"]),
    ("streaming hf fsdp", (*STREAM, *RAY_TWO),
     ["trainer.async_mode=streaming", "actor.strategy='fsdp2' over 2", "placement.roles.rollout"]),
    ("async_mode off", ("trainer.async_mode=off",),
     ["trainer.async_mode='False'", "boolean", "trainer.async_mode='pipeline'"]),
    ("dp x tp", ("placement.parallel.actor.tp=2", "placement.parallel.actor.dp=2", *RAY_TWO),
     ["placement.parallel.actor", "dp=2 x tp=2"]),
    ("local tp", ("placement.pools.main.devices_per_node=2", "placement.parallel.actor.tp=2"),
     ["local runtime", "role 'actor'", "--runtime ray"]),
    ("local sp", ("placement.pools.main.devices_per_node=2", "placement.parallel.actor.sp=2"),
     ["placement.parallel.actor.sp=2", "local runtime", "--runtime ray"]),
    ("sp heads", ("model.path={gpt2_3heads}", "model.tokenizer=char",
                  "placement.parallel.actor.sp=2", *RAY_TWO),
     ["placement.parallel.actor.sp=2", "num_attention_heads=3", "allows at tp=1: [1, 3]"]),
    ("sp sliding window", ("model.path={qwen2_sliding}", "model.tokenizer=char",
                           "placement.parallel.actor.sp=2", *RAY_TWO),
     ["placement.parallel.actor.sp=2", "sliding-window attention", "set sp=1"]),
    ("sp attention", ("model.path={llama_flex}", "model.tokenizer=char",
                      "placement.parallel.actor.sp=2", *RAY_TWO),
     ["placement.parallel.actor.sp=2", "attn_implementation='flex_attention'", "set sp=1"]),
    ("sp generate-only role", ("placement.parallel.rollout.sp=2", *RAY_TWO),
     ["placement.parallel.rollout.sp=2", "role 'rollout' only generates",
      "(actor, ref, critic)"]),
    ("sp x tp heads", ("placement.parallel.actor.sp=2", "placement.parallel.actor.tp=2",
                       "runtime.name=ray", "placement.pools.main.devices_per_node=4"),
     ["placement.parallel.actor.sp=2", "sp x tp = 4", "num_key_value_heads=2",
      "allows at tp=2: [1]"]),
    ("sp x tp lora", ("model.path={llama_4kv}", "model.tokenizer=char",
                      "placement.parallel.actor.sp=2", "placement.parallel.actor.tp=2",
                      "actor.lora.rank=4", "runtime.name=ray", "actor.strategy=fsdp2",
                      "placement.pools.main.devices_per_node=4"),
     ["placement.parallel.actor.tp=2", "actor.lora.rank=4", "not supported"]),
    ("runtime flags", ("--runtime", "local", "--address", "10.0.0.1:6379"),
     ["--runtime local and --address 10.0.0.1:6379 contradict"]),
    ("cores overlap", ("placement.pools.main.cores=[0]", "placement.pools.gen.cores=[0]",
                       "placement.roles.reward=gen", "runtime.name=ray"),
     ["placement.pools.gen.cores=[0]", "placement.pools.main.cores=[0]", "core(s) [0]"]),
    ("cores absent", ("placement.pools.main.cores=[4095]", "runtime.name=ray"),
     ["placement.pools.main.cores=[4095]", "[4095] are not among the cores"]),
    ("cores not a list", ("placement.pools.main.cores=abc",),
     ["placement.pools.main.cores", "takes a list"]),
    ("vllm tp over a rank's pinned cores", ("rollout.backend=vllm", "placement.parallel.actor.tp=2",
                                            *RAY_TWO, "placement.pools.main.cores=[0,1]"),
     ["placement.parallel.actor.tp=2", "rollout.backend='vllm'", "1 core(s) ([0])",
      "use tp <= 1"]),
    ("control character", ("trainer.run_name=x\x1b[2J",),
     ["override trainer.run_name: control character U+001B"]),
]


def _argv(row: tuple, dirs: dict) -> list[str]:
    return [a.format(**dirs) if "{" in a else a for a in row]


def _one(command: str, argv: list[str], capsys) -> tuple[int, list[str]]:
    code = main([command, GRPO, *argv])
    err = capsys.readouterr().err
    # notes (`run`'s "note: model.path=... is your model") are not refusals
    return code, [line for line in err.splitlines()
                  if line.strip() and not line.startswith(f"hybridflow {command}: note:")]


@pytest.mark.parametrize("argv, words", [r[1:] for r in REFUSED], ids=[r[0] for r in REFUSED])
def test_what_run_refuses_before_launch_check_refuses_in_the_same_words(
        argv, words, gpt2_dirs, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("hybridflow.run.loop.Trainer", _NoTrainer)
    runs = tmp_path / "runs"
    argv = _argv(argv, gpt2_dirs)
    check_code, check_lines = _one("check", argv, capsys)
    run_code, run_lines = _one("run", [*argv, f"trainer.runs_dir={runs}"], capsys)
    assert (check_code, run_code) == (1, 1), (check_lines, run_lines)
    assert len(check_lines) == 1 and len(run_lines) == 1, (check_lines, run_lines)
    said = check_lines[0].removeprefix("hybridflow check: ")
    assert run_lines[0] == f"hybridflow run: {said}"
    for word in words:
        assert word in said, (word, said)
    assert "Traceback" not in said and "\x1b" not in said
    assert not runs.exists() or not os.listdir(runs)  # run started nothing


@pytest.mark.parametrize("argv", [
    ("model.path={gpt2}", "model.tokenizer=char"),
    ("--runtime", "local", "placement.pools.main.cores=[0]"),
    ("placement.parallel.actor.tp=1", "placement.roles.critic=main"),  # known, unused role
    ("placement.parallel.actor.sp=2", *RAY_TWO),
    ("placement.parallel.actor.sp=2", "actor.lora.rank=4", *RAY_TWO),
    ("model.path={llama_4kv}", "model.tokenizer=char", "placement.parallel.actor.sp=2",
     "placement.parallel.actor.tp=2", "runtime.name=ray", "actor.strategy=fsdp2",
     "placement.pools.main.devices_per_node=4"),
], ids=["gpt2 names", "runtime flag", "unused role", "actor sp=2 on ray", "sp with lora",
        "sp x tp"])
def test_what_check_accepts_run_takes_to_its_workers(argv, gpt2_dirs, tmp_path, capsys,
                                                     monkeypatch):
    monkeypatch.setattr("hybridflow.run.loop.Trainer", _NoTrainer)
    argv = _argv(argv, gpt2_dirs)
    check_code, check_lines = _one("check", argv, capsys)
    assert check_code == 0, check_lines
    run_code, run_lines = _one("run", [*argv, f"trainer.runs_dir={tmp_path / 'runs'}"], capsys)
    assert run_code == 1, run_lines
    assert "hybridflow run: could not start: Launched: launched" in run_lines, run_lines


def test_check_takes_runs_arguments(capsys, tmp_path):
    """The same command line: `check` takes --runtime, --address and --resume, and says
    what it cannot check without the workers; a --resume that finds no run is refused
    with `run`'s words (a usable resume: tests/e2e/test_resume_unusable_checkpoint.py)."""
    code = main(["check", GRPO, "--runtime", "ray", "--address", "10.0.0.1:6379",
                 "trainer.steps=3"])
    out = capsys.readouterr().out
    assert code == 0
    assert "note: --address 10.0.0.1:6379" in out
    argv = [GRPO, "--resume", f"trainer.runs_dir={tmp_path}", "trainer.steps=3"]
    said = {}
    for command in ("check", "run"):
        assert main([command, *argv]) == 1
        said[command] = capsys.readouterr().err.strip().removeprefix(f"hybridflow {command}: ")
    assert said["check"] == said["run"] and "no earlier run" in said["check"], said
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("tp", [2, 3])
def test_a_vllm_tp_above_the_cores_a_worker_may_run_on_is_refused_by_both(tp, capsys,
                                                                         monkeypatch, tmp_path):
    """Without pinned cores a worker runs on this machine's affinity mask (Ray's workers
    inherit it): a one-core mask refuses tp=2 and tp=3 (a model with 6 heads and 6 KV
    heads divides both), before launch, in one line naming the key, tp and the cores."""
    monkeypatch.setattr("hybridflow.run.loop.Trainer", _NoTrainer)
    monkeypatch.setattr("hybridflow.program.placement_checks.allowed_cores", lambda: {1})
    argv = ["rollout.backend=vllm", f"placement.parallel.actor.tp={tp}", "runtime.name=ray",
            f"placement.pools.main.devices_per_node={tp}", "actor.strategy=fsdp2",
            "model.path=null", "model.tokenizer=char",
            "model.hf_config.num_attention_heads=6", "model.hf_config.num_key_value_heads=6",
            "model.hf_config.hidden_size=48", "data.batch_size=6", "actor.mini_batch_size=6"]
    check_code, check_lines = _one("check", argv, capsys)
    run_code, run_lines = _one("run", [*argv, f"trainer.runs_dir={tmp_path / 'runs'}"], capsys)
    assert (check_code, run_code) == (1, 1) and len(check_lines) == len(run_lines) == 1
    said = check_lines[0].removeprefix("hybridflow check: ")
    assert run_lines[0] == f"hybridflow run: {said}"
    assert said.startswith(f"placement.parallel.actor.tp={tp}: rollout.backend='vllm'"), said
    assert "may run on 1 core(s) ([1]); use tp <= 1" in said
