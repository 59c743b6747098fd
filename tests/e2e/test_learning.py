"""End to end, the shipped graphs learn the toy task: GRPO's embedded default on both
runtimes (local on one device; Ray with logical GPUs on two colocated ranks), PPO
with the critic on a pool of its own on Ray, and the run directory and metrics they
write."""
import json
import os

import pytest

from tests.support.e2e import graph_file, series, train

RAY = ("runtime.name=ray", "trainer.steps=12", "trainer.val_every=12", "trainer.val_samples=1",
       "runtime.torch_threads=1")
VAL = "val/toy_arith/greedy"
# Per runtime: the run's overrides and the held-out accuracy it must gain.
LEARNS = {"local": (("trainer.steps=30", "trainer.val_every=15"), 0.4),
          "ray": ((*RAY, "placement.pools.main.devices_per_node=2"), 0.3)}


def test_grpo_embedded_default_raises_held_out_accuracy(shared_runs, runtime_name):
    overrides, gain = LEARNS[runtime_name]
    # test_rollout_placement's colocated baseline is this very run: trained once
    trainer, metrics = shared_runs.train("grpo", *overrides)
    accuracy = series(metrics, VAL)
    assert accuracy[-1] >= accuracy[0] + gain, accuracy
    assert trainer.run.status()["state"] == "finished"
    if runtime_name == "ray":
        assert metrics[-1]["engine/driver_bytes"] > 0  # the feeds are counted
        assert "timing_s/actor.update" in metrics[-1]
        return
    assert accuracy[0] < 0.5, "the shipped base model should leave RL something to do"
    assert max(series(metrics, "critic/score/mean")[-5:]) > series(metrics, "critic/score/mean")[0]
    run = trainer.run
    assert json.load(open(run.file("status.json")))["state"] == "finished"
    assert os.path.isfile(run.file("config.yaml"))
    assert any(name.startswith("step_") for name in os.listdir(run.checkpoints))
    for key in ("actor/pg_loss", "timing_s/rollout.generate", "perf/time_per_step",
                "engine/driver_bytes"):
        assert key in metrics[-1], key


def test_tensorboard_events_are_written(tmp_path):
    trainer, _ = train("grpo", tmp_path, "trainer.steps=1", "trainer.val_every=0",
                       "trainer.tensorboard=true", "data.batch_size=4", "rollout.n=2",
                       "actor.mini_batch_size=8")
    events = os.listdir(os.path.join(trainer.run.path, "tensorboard"))
    assert any(name.startswith("events.out.tfevents") for name in events)


@pytest.mark.slow  # a training run on Ray
@pytest.mark.ray
@pytest.mark.usefixtures("ray_session")
def test_ppo_with_critic_on_its_own_pool_learns(tmp_path):
    _, metrics = train("ppo", tmp_path, *RAY, "trainer.val_every=0", "trainer.steps=20",
                       "actor.lr=4e-4",
                       "placement.pools={main: {devices_per_node: 1}, "
                       "critic: {devices_per_node: 1}}",
                       "placement.roles.critic=critic")
    scores = series(metrics, "critic/score/mean")  # PPO's greedy flip comes later
    first, last = sum(scores[:4]) / 4, sum(scores[-4:]) / 4
    assert last >= first + 0.15, scores
    assert "critic/vf_loss" in metrics[-1] and "timing_s/critic.update" in metrics[-1]


# The fast tier's Ray test: one short run on the Ray runtime, end to end.
@pytest.mark.ray
@pytest.mark.usefixtures("ray_session")
def test_ray_step_reports_throughput(tmp_path):
    _, metrics = train("grpo", tmp_path, "runtime.name=ray", "trainer.steps=1",
                       "trainer.val_every=0", "data.batch_size=4", "rollout.n=2",
                       "actor.mini_batch_size=8")
    assert metrics[-1]["perf/throughput"] > 0


@pytest.mark.slow  # a training run on Ray
@pytest.mark.ray
@pytest.mark.usefixtures("ray_session")
def test_real_ppo_step_keeps_tensors_off_the_driver(tmp_path):
    """Only the prompt feed and control cross the driver: GAE and the KL-in-reward
    node run on a worker. With longer responses the share only falls."""
    from hybridflow.program.assemble import prepare
    from hybridflow.core.data import PromptDataset, PromptLoader, toy_rows
    from hybridflow.runtime.ray.executor import RayRuntime
    from hybridflow.workers.tokenizer import load_tokenizer, tokenizer_spec

    loaded = prepare(graph_file("ppo"), ["runtime.name=ray", "rollout.max_new_tokens=128",
                                         "placement.pools.main.devices_per_node=2"])
    tok = load_tokenizer(tokenizer_spec(loaded.cfg.model))
    rows, _ = toy_rows(1, 9, 0.25)
    loader = PromptLoader(PromptDataset(rows, tok, 8), 16, tok.pad_token_id)
    runtime = RayRuntime(loaded.plan, loaded.cfg, seed=1)
    try:
        result = runtime.run_step({"prompts": loader.next_batch()})
        share = result.driver_bytes / runtime.output_bytes(result)
    finally:
        runtime.shutdown()
    assert share < 0.01, (result.driver_bytes, share)


@pytest.mark.slow  # a training run on Ray
@pytest.mark.ray
@pytest.mark.usefixtures("ray_session")
def test_auto_placement_runs_on_ray(tmp_path, capsys):
    trainer, metrics = train("ppo", tmp_path, "runtime.name=ray", "placement=auto",
                             "placement.cluster.devices_per_node=4", "trainer.steps=2",
                             "trainer.val_every=0")
    assert "Best plan" in capsys.readouterr().out
    pools = trainer.plan.placement.pools
    assert sum(p.world_size for p in pools.values()) == 4
    assert "critic/vf_loss" in metrics[-1] and "actor/pg_loss" in metrics[-1]
