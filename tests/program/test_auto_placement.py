"""placement=auto: the planner's best placement becomes the run's placement."""
import os

from hybridflow.plan.async_split import sides_of
from hybridflow.program.assemble import prepare

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PPO = os.path.join(REPO, "graphs", "ppo.py")


def test_auto_placement_replaces_the_placement_section(capsys):
    loaded = prepare(PPO, ["placement=auto", "placement.cluster.devices_per_node=4",
                           "runtime.name=ray"], preflight=False)
    placement = loaded.plan.placement
    assert sum(p.world_size for p in placement.pools.values()) == 4
    assert {"actor", "ref", "critic", "reward"} <= set(placement.roles)
    assert loaded.cfg.placement.auto is False  # the saved config replays the choice
    assert set(loaded.cfg.placement.pools) == set(placement.pools)
    assert "Best plan" in capsys.readouterr().out


def test_auto_placement_on_one_device_colocates_everything(capsys):
    loaded = prepare(PPO, ["placement=auto"], preflight=False)
    assert len(loaded.plan.placement.pools) == 1


GRPO = os.path.join(os.path.dirname(PPO), "grpo.py")
ASYNC_AUTO = ["placement=auto", "placement.cluster.device=a100-80g", "trainer.staleness=1",
              "trainer.allow_uncorrected_async=true", "runtime.name=ray"]


def test_async_auto_placement_puts_the_rollout_on_a_pool_of_its_own_when_that_wins(capsys):
    """Two GPUs: a rollout apart skips the engine switch each step and overlaps training."""
    loaded = prepare(GRPO, ASYNC_AUTO + ["placement.cluster.devices_per_node=2"],
                     preflight=False)
    roles = loaded.plan.placement.roles
    assert roles["rollout"] != roles["actor"]
    assert "rollout" not in loaded.plan.placement.folded
    assert "weight_sync" in {n.name for n in loaded.plan.nodes}  # the compiler's real sync
    assert sides_of(loaded.plan) is not None
    out = capsys.readouterr().out
    assert "beats the rollout sharing the actor's devices" in out


def test_async_auto_placement_on_one_device_keeps_the_rollout_folded(capsys):
    loaded = prepare(GRPO, ASYNC_AUTO + ["placement.cluster.devices_per_node=1"],
                     preflight=False)
    assert loaded.plan.placement.folded == {"rollout": "actor"}
    assert "weight_sync" not in {n.name for n in loaded.plan.nodes}
    assert "No plan with the rollout on a pool of its own fits" in capsys.readouterr().out


def test_streaming_auto_placement_splits_the_devices_by_the_producer_consumer_model(capsys):
    """Streaming on two GPUs: the rollout apart generates beside training, no barrier; the
    explanation says which side is the bottleneck and each side's busy fraction."""
    loaded = prepare(GRPO, ASYNC_AUTO + ["placement.cluster.devices_per_node=2",
                                         "trainer.async_mode=streaming"], preflight=False)
    roles = loaded.plan.placement.roles
    assert roles["rollout"] != roles["actor"] and "rollout" not in loaded.plan.placement.folded
    out = capsys.readouterr().out
    assert "async streaming, staleness 1" in out
    assert "Streaming: a step takes max(rollout side" in out and "no barrier" in out
    assert "bottleneck: the train side" in out and "busy: rollout side" in out
    assert "1 device(s) generating, 1 training" in out


def test_auto_placement_puts_the_generation_tp_on_the_folded_rollout(capsys):
    """A 13B-shaped model on 8 x a100-40g: the planner generates with tp > 1; the run's
    layout is that tp on the rollout (in the actor's processes) while the actor trains
    over every rank -- what `check` prints and the workers build."""
    big = ["model.path=null", "placement.cluster.device=a100-40g", "placement=auto",
           "placement.cluster.devices_per_node=8", "runtime.name=ray"] + [
        f"model.hf_config.{key}={value}" for key, value in (
            ("hidden_size", 5120), ("intermediate_size", 13824), ("num_hidden_layers", 40),
            ("num_attention_heads", 40), ("num_key_value_heads", 40))]
    loaded = prepare(GRPO, big, preflight=False)
    placement = loaded.plan.placement
    assert placement.folded == {"rollout": "actor"}
    tp = placement.tp_size("rollout")
    assert tp > 1 and placement.tp_size("actor") == 1
    world = placement.pools[placement.roles["actor"]].world_size
    assert placement.parallel["actor"]["dp"] == world
    layout = f"dp {world // tp} x sp 1 x tp {tp}"
    assert f"layout: rollout on pool {placement.roles['rollout']}: {layout}" \
        in loaded.plan.summary()


def test_auto_placement_plans_generation_at_tp_1_where_the_run_cannot_build_more(
        capsys, monkeypatch):
    """The planner reads declarations: an engine registered without tensor_parallel, or
    a runtime that runs every rank in one process, gets the 13B case above at tp=1."""
    import hybridflow.workers.rollout.engine as engines
    big = ["model.path=null", "placement.cluster.device=a100-80g", "placement=auto",
           "placement.cluster.devices_per_node=8", "runtime.name=ray"] + [
        f"model.hf_config.{key}={value}" for key, value in (
            ("hidden_size", 5120), ("intermediate_size", 13824), ("num_hidden_layers", 40),
            ("num_attention_heads", 40), ("num_key_value_heads", 40))]
    free = prepare(GRPO, big, preflight=False).plan.placement
    assert max(free.tp_size(r) for r in free.roles) > 1  # tp is what it would pick here
    monkeypatch.setattr(engines, "engine_supports_tp", lambda name: False)
    placement = prepare(GRPO, big, preflight=False).plan.placement
    assert all(placement.tp_size(role) == 1 for role in placement.roles)


def test_generation_tp_reads_the_engine_and_the_runtime():
    from hybridflow.program.auto_placement import generation_tp
    from hybridflow.program.config import build_config
    assert generation_tp(build_config(overrides=["runtime.name=ray"])) == 0  # hf: tp ok
    assert generation_tp(build_config(overrides=["runtime.name=local"])) == 1  # one process


def _qwen05_dir(tmp_path) -> str:
    """A model directory with Qwen2-0.5B's config (14 heads, 2 KV heads, a 152k
    vocabulary): shapes only, for the planner and check."""
    import json
    from safetensors.torch import save_file
    import torch
    path = tmp_path / "qwen2_05b"
    path.mkdir()
    (path / "config.json").write_text(json.dumps({
        "model_type": "qwen2", "hidden_size": 896, "num_hidden_layers": 24,
        "num_attention_heads": 14, "num_key_value_heads": 2, "intermediate_size": 4864,
        "vocab_size": 151936, "tie_word_embeddings": True, "max_position_embeddings": 40960,
        "use_sliding_window": False}))
    save_file({"w": torch.zeros(1)}, str(path / "model.safetensors"))
    return str(path)


def _long_rows(model_dir: str, runtime: str) -> list[str]:
    # one row of 256 + 32,768 tokens does not fit an A100-40G's update at sp=1
    return ["placement=auto", f"runtime.name={runtime}", "placement.cluster.devices_per_node=2",
            "placement.cluster.device=a100-40g", f"model.path={model_dir}",
            "model.tokenizer=char", "rollout.max_new_tokens=32768", "data.batch_size=4",
            "rollout.n=2", "actor.mini_batch_size=8"]


def test_auto_placement_plans_sp_for_a_row_one_device_cannot_hold_and_check_passes(
        tmp_path, capsys):
    """What the planner plans runs: the planned layout (the actor at sp=2, generating at
    dp 2) is the run's config, and `check` (pre-flight included) accepts it."""
    from hybridflow.cli import main
    overrides = _long_rows(_qwen05_dir(tmp_path), "ray")
    loaded = prepare(GRPO, overrides, preflight=False)
    placement = loaded.plan.placement
    assert placement.sp_size("actor") == 2 and placement.layout("actor").dp == 1
    assert placement.layout("actor", generating=True).dp == 2
    assert loaded.cfg.placement.parallel["actor"].sp == 2  # the saved config replays it
    assert "Sequence parallelism: actor at sp=2" in capsys.readouterr().out
    assert main(["check", GRPO, *overrides]) == 0
    out = capsys.readouterr().out
    assert "layout: actor on pool" in out and "dp 1 x sp 2 x tp 1" in out, out
    assert out.rstrip().endswith("ok")


def test_auto_placement_splits_no_row_where_the_run_cannot(tmp_path):
    """The local runtime (one process) cannot run sp: the planner keeps sp=1 and says
    the long row fits nowhere, naming the pass."""
    import pytest
    from hybridflow.program.config import ConfigError
    with pytest.raises(ConfigError, match=r"(?s)placement=auto: no placement fits.*peak "
                       r"actor.update.*split rows over sp ranks"):
        prepare(GRPO, _long_rows(_qwen05_dir(tmp_path), "local"), preflight=False)


def test_can_split_rows_reads_the_runtime_and_the_model():
    from hybridflow.program.auto_placement import can_split_rows
    from hybridflow.program.config import build_config
    assert can_split_rows(build_config(overrides=["runtime.name=ray"]))
    assert not can_split_rows(build_config(overrides=["runtime.name=local"]))
    # LoRA runs at sp (tp=1): no reason to keep its long rows whole
    assert can_split_rows(build_config(overrides=["runtime.name=ray", "actor.lora.rank=4"]))
    sliding = build_config(overrides=["runtime.name=ray", "model.path=null",
                                      "model.hf_config.sliding_window=16",
                                      "model.hf_config.use_sliding_window=true"])
    assert not can_split_rows(sliding)


def test_auto_placement_plans_sp_for_a_lora_run_and_check_passes(tmp_path, capsys):
    """A LoRA run whose one row fits no device whole: the planner splits it over sp
    ranks at tp=1 (LoRA's adapters replicate over sp), and `check` accepts the plan."""
    from hybridflow.cli import main
    overrides = _long_rows(_qwen05_dir(tmp_path), "ray") + ["actor.lora.rank=8"]
    placement = prepare(GRPO, overrides, preflight=False).plan.placement
    assert placement.sp_size("actor") == 2 and placement.tp_size("actor") == 1
    capsys.readouterr()
    assert main(["check", GRPO, *overrides]) == 0
    out = capsys.readouterr().out
    assert "dp 1 x sp 2 x tp 1" in out and out.rstrip().endswith("ok"), out
