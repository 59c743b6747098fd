"""FSDP2 end to end on the Ray runtime, on the CPU: GRPO with `actor.strategy=fsdp2`
over two colocated ranks (gloo) shards the actor's optimizer state and learns the toy
task like the DDP run does."""
import pytest

from tests.support.e2e import series, train

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.usefixtures("ray_session")]

TWO_RANKS = ("runtime.name=ray", "placement.pools.main.devices_per_node=2",
             "runtime.torch_threads=1")


def test_grpo_with_fsdp2_on_two_ranks_learns(tmp_path):
    trainer, metrics = train("grpo", tmp_path / "fsdp2", *TWO_RANKS, "actor.strategy=fsdp2",
                             "trainer.steps=12", "trainer.val_every=12",
                             "trainer.val_samples=1")
    accuracy = series(metrics, "val/toy_arith/greedy")
    assert accuracy[-1] >= accuracy[0] + 0.3, accuracy
    assert trainer.run.status()["state"] == "finished"
    _, ddp = train("grpo", tmp_path / "ddp", *TWO_RANKS, "trainer.steps=1",
                   "trainer.val_every=0")
    key = "engine/optimizer_bytes"  # measured once, at the first step
    sharded, whole = series(metrics, key)[0], series(ddp, key)[0]
    assert sharded == pytest.approx(whole / 2, rel=0.05)  # each rank holds half the state
