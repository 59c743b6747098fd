"""FSDP2 end to end on the Ray runtime, on the CPU: GRPO with `actor.strategy=fsdp2`
over two colocated ranks (gloo) learns the toy task like the DDP run does."""
import pytest

from tests.support.e2e import series, train

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.usefixtures("ray_session")]


def test_grpo_with_fsdp2_on_two_ranks_learns(tmp_path):
    trainer, metrics = train("grpo", tmp_path, "runtime.name=ray", "actor.strategy=fsdp2",
                             "placement.pools.main.devices_per_node=2", "trainer.steps=12",
                             "trainer.val_every=12", "trainer.val_samples=1",
                             "runtime.torch_threads=1")
    accuracy = series(metrics, "val/toy_arith/greedy")
    assert accuracy[-1] >= accuracy[0] + 0.3, accuracy
    assert trainer.run.status()["state"] == "finished"
