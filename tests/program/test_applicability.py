"""Class: settings that do nothing are said to do nothing (issue 32, class 5).

The sweep walks the whole declaration table (`program/applicability.APPLIES`): each
key, set where its declaration says it does not apply, is refused or warned about
naming the key, the rule and why; set where it applies, nothing is said. Then the
issue's cases through `hybridflow check`, and `export` onto a checkpoint directory.
"""
from __future__ import annotations

import pytest

from hybridflow.cli import main
from hybridflow.core.constraints import ConfigError
from hybridflow.program.applicability import APPLIES, check_applicable, set_keys
from hybridflow.program.config import build_config
from tests.support.e2e import graph_file

# a value other than the default, for every key of the table
VALUES = {
    "rollout.gpu_memory_utilization": "0.25", "rollout.kv_cache_gib": "2.0",
    "rollout.enforce_eager": "true", "rollout.max_model_len": "64",
    "rollout.max_num_seqs": "8", "rollout.enable_sleep_mode": "false",
    "rollout.stream_poll_steps": "2", "rollout.partial": "false",
    "trainer.stream_side": "generate_only",
    "trainer.async_mode": "streaming", "trainer.allow_uncorrected_async": "true",
    "trainer.dump_batches": "[99]", "trainer.val_samples": "2",
    "trainer.log_val_generations": "1", "data.val_files": "val.jsonl",
    "data.toy.max_operand": "5", "data.toy.test_fraction": "0.5",
    "data.toy.train_on_test": "true",
    "data.toy.maker": "algorithms.rewards.word_arith:train_test_rows",
    "runtime.address": "10.0.0.1:6379", "runtime.listen_all": "true",
    "runtime.num_cpus": "2", "runtime.num_gpus": "1", "runtime.start_timeout_s": "5",
    "runtime.connect_timeout_s": "5", "placement.pools.*.cores": "[0]",
    "rollout.hf_loop": "generate",
}
# a rule's words -> (a run where it does not apply, a run where it does)
CONTEXTS = {
    "vllm only": ((), ("rollout.backend=vllm",)),
    "rollout.backend=hf": (("rollout.backend=vllm",), ()),
    "trainer.async_mode=streaming": ((), ("trainer.staleness=1",
                                          "trainer.async_mode=streaming")),
    "trainer.staleness >= 1": ((), ("trainer.staleness=1",)),
    "steps 1..trainer.steps": (("trainer.steps=5",), ("trainer.steps=100",)),
    "trainer.val_every > 0": (("trainer.val_every=0",), ("trainer.val_every=5",)),
    "with data.train_files (else the toy task validates)": (
        (), ("data.train_files=train.jsonl",)),
    "without data.train_files (the toy task)": (("data.train_files=train.jsonl",), ()),
    "runtime.name=ray": ((), ("runtime.name=ray",)),
}


def test_the_sweep_covers_the_whole_table():
    assert set(VALUES) == set(APPLIES)
    assert {rule.when for rule in APPLIES.values()} == set(CONTEXTS)
    assert {rule.action for rule in APPLIES.values()} == {"warn", "refuse"}


def _cfg(key: str, *context: str):
    return build_config(None, None, [f"{_one(key)}={VALUES[key]}", *context])


def _one(key: str) -> str:
    """A table key as a run sets it: `*` (every pool) is the default pool, main."""
    return key.replace("*", "main")


SWITCHED = sorted(k for k, rule in APPLIES.items() if rule.switch)


@pytest.mark.parametrize("key", sorted(set(APPLIES) - set(SWITCHED)))
def test_a_set_key_that_does_not_apply_is_refused_or_warned_naming_it(key, capsys):
    rule = APPLIES[key]
    off, on = CONTEXTS[rule.when]
    cfg = _cfg(key, *off)
    assert _one(key) in set_keys(cfg)
    start = f"{_one(key)}="
    if rule.action == "refuse":
        with pytest.raises(ConfigError) as err:
            check_applicable(cfg)
        text = str(err.value)
        assert text.endswith("remove it or change the run so that it applies")
    else:
        said = check_applicable(cfg)
        assert len(said) == 1
        text = said[0]
        assert capsys.readouterr().err == f"hybridflow: warning: {text}\n"
        assert text.endswith("it is ignored")
    assert text.startswith(start) and f"has no effect in this run: it applies {rule.when}, " \
        f"and here " in text


@pytest.mark.parametrize("key", SWITCHED)
def test_a_key_of_a_feature_the_user_turned_off_is_moot_not_warned(key, capsys):
    """trainer.val_every=0 turns validation off by the user's choice: the validation
    keys, set by a shipped config (smollm2_arith.yaml: trainer.val_samples=1) or by the
    user, are moot (issue 36: the shipped config warned)."""
    rule = APPLIES[key]
    off, _ = CONTEXTS[rule.when]
    cfg = _cfg(key, *off)
    assert _one(key) in set_keys(cfg) and rule.why_not(cfg, VALUES[key]) is not None
    assert check_applicable(cfg) == [] and capsys.readouterr().err == ""


def test_the_shipped_real_model_config_without_validation_is_said_nothing(capsys):
    import os
    config = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__)))), "graphs", "configs", "smollm2_arith.yaml")
    cfg = build_config(None, config, ["trainer.val_every=0"])
    assert cfg.trainer.val_samples == 1  # the shipped file's, not the schema's
    assert check_applicable(cfg) == [] and capsys.readouterr().err == ""


@pytest.mark.parametrize("key", sorted(APPLIES))
def test_a_set_key_that_applies_is_said_nothing(key, capsys):
    _, on = CONTEXTS[APPLIES[key].when]
    if key == "trainer.async_mode":
        on = ("trainer.staleness=1",)  # the value itself is streaming
    value = "[1]" if key == "trainer.dump_batches" else VALUES[key]
    cfg = build_config(None, None, [f"{_one(key)}={value}", *on])
    assert check_applicable(cfg) == []
    assert capsys.readouterr().err == ""


def test_keys_left_at_their_defaults_are_not_set():
    assert set_keys(build_config(None, None, [])) == {}


@pytest.mark.parametrize("override,said", [
    ("rollout.max_num_seqs=8", "hybridflow: warning: rollout.max_num_seqs=8 has no effect "
                               "in this run: it applies vllm only, and here "
                               "rollout.backend='hf'; it is ignored"),
    ("trainer.dump_batches=[99]", "hybridflow check: trainer.dump_batches=[99] has no effect "
                                  "in this run: it applies steps 1..trainer.steps, and here "
                                  "trainer.steps=40: step(s) [99] never run"),
    ("data.val_files={val}", "hybridflow check: data.val_files='{val}' has no effect in this "
                             "run: it applies with data.train_files (else the toy task "
                             "validates), and here data.train_files is not set"),
])
def test_the_issue_cases_through_check(capsys, tmp_path, override, said):
    val = tmp_path / "val.jsonl"
    val.write_text('{"prompt": "1+1=", "data_source": "toy_arith", '
                   '"reward_model": {"ground_truth": "2"}}\n')
    code = main(["check", graph_file("ppo"), override.format(val=val)])
    err = capsys.readouterr().err
    assert said.format(val=val) in err
    assert code == (0 if "warning" in said else 1)


@pytest.mark.slow  # one short run
def test_export_onto_a_checkpoint_directory_is_one_line(capsys, tmp_path):
    assert main(["run", graph_file("grpo"), f"trainer.runs_dir={tmp_path}",
                 "trainer.run_name=run", "trainer.steps=1", "trainer.val_every=0",
                 "trainer.progress=false", "data.batch_size=4", "rollout.n=2",
                 "actor.mini_batch_size=8"]) == 0
    ckpt = tmp_path / "run" / "checkpoints" / "step_000001"
    capsys.readouterr()
    for out in (ckpt / "actor", ckpt, tmp_path / "run" / "checkpoints" / "new"):
        code = main(["export", str(tmp_path / "run"), str(out)])
        err = capsys.readouterr().err
        assert code == 1
        assert err == (f"hybridflow export: OUT {str(out)!r} is inside the run's checkpoints; "
                       f"export to a directory outside {tmp_path}/run/checkpoints\n")
