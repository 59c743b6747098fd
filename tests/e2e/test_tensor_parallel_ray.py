"""Tensor parallelism end to end on the Ray runtime, on the CPU: GRPO with the actor at
`placement.parallel.actor.tp=2` on a pool of two ranks (one tp group, gloo) shards the
actor (DTensor plan, vocab-parallel log-probs), generates on the sharded module with the
hf engine, and learns the toy task, each rank holding half the actor's weights; the
local runtime refuses the same layout before launch, naming the Ray runtime."""
import pytest

from tests.support.e2e import series, train

TP2 = ("placement.pools.main.devices_per_node=2", "runtime.torch_threads=1",
       "actor.strategy=fsdp2", "placement.parallel.actor.tp=2")


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.usefixtures("ray_session")
def test_grpo_with_a_tp2_actor_learns_on_ray(tmp_path):
    trainer, metrics = train("grpo", tmp_path / "tp2", "runtime.name=ray", *TP2,
                             "trainer.steps=12", "trainer.val_every=12",
                             "trainer.val_samples=1")
    accuracy = series(metrics, "val/toy_arith/greedy")
    assert accuracy[-1] >= accuracy[0] + 0.3, accuracy
    assert trainer.run.status()["state"] == "finished"
    reward = series(metrics, "critic/score/mean") or series(metrics, "reward/mean")
    assert reward and max(reward[-4:]) > min(reward[:4]), reward
    # tp=1 under ddp: each rank holds the whole actor
    _, whole = train("grpo", tmp_path / "tp1", "runtime.name=ray", *TP2[:2],
                     "trainer.steps=1", "trainer.val_every=0")
    key = "engine/weight_bytes"  # both processes' weights, measured at the first step
    ratio = series(metrics, key)[0] / series(whole, key)[0]
    # the actor's half on each rank beside the reference's whole copy: 3/4 of tp=1's
    assert ratio == pytest.approx(0.75, abs=0.03), ratio


def test_the_local_runtime_refuses_a_tp2_actor_before_launch(tmp_path):
    from hybridflow.core.constraints import ConfigError
    with pytest.raises(ConfigError, match=r"--runtime ray"):
        train("grpo", tmp_path / "local", "runtime.name=local", *TP2, "trainer.steps=1")
