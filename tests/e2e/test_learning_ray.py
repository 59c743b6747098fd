"""End to end on the Ray runtime with logical GPUs: GRPO and PPO learn in two
placements (all roles colocated; critic on a pool of its own), metrics are written."""
import pytest

from tests.support.e2e import graph_file, series, train

pytestmark = [pytest.mark.ray, pytest.mark.usefixtures("ray_session")]


RAY = ("runtime.name=ray", "trainer.steps=12", "trainer.val_every=12", "trainer.val_samples=1",
       "runtime.torch_threads=1")
VAL = "val/toy_arith/greedy"


def _rises(metrics):
    """Held-out greedy accuracy before and after training."""
    accuracy = series(metrics, VAL)
    return accuracy[0], accuracy[-1]


@pytest.mark.slow  # a training run on Ray
def test_grpo_on_two_colocated_ranks_learns(tmp_path):
    trainer, metrics = train("grpo", tmp_path, *RAY, "placement.pools.main.devices_per_node=2")
    first, last = _rises(metrics)
    assert last >= first + 0.3, (first, last)
    assert metrics[-1]["engine/driver_bytes"] > 0  # the feeds are counted
    assert "timing_s/actor.update" in metrics[-1]
    assert trainer.run.status()["state"] == "finished"


@pytest.mark.slow  # a training run on Ray
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
def test_ray_step_reports_throughput(tmp_path):
    _, metrics = train("grpo", tmp_path, "runtime.name=ray", "trainer.steps=1",
                       "trainer.val_every=0", "data.batch_size=4", "rollout.n=2",
                       "actor.mini_batch_size=8")
    assert metrics[-1]["perf/throughput"] > 0


@pytest.mark.slow  # a training run on Ray
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
def test_auto_placement_runs_on_ray(tmp_path, capsys):
    trainer, metrics = train("ppo", tmp_path, "runtime.name=ray", "placement=auto",
                             "placement.cluster.devices_per_node=4", "trainer.steps=2",
                             "trainer.val_every=0")
    assert "Best plan" in capsys.readouterr().out
    pools = trainer.plan.placement.pools
    assert sum(p.world_size for p in pools.values()) == 4
    assert "critic/vf_loss" in metrics[-1] and "actor/pg_loss" in metrics[-1]
