"""A rollout on its own pool syncing from an actor that FSDP2 shards over two Ray ranks
(refused before the sync went bucket by bucket): every actor rank gathers in lockstep,
rank 0 puts one object per bucket, the rollout ranks load them, and every row says
which policy version sampled it."""
import pytest

from hybridflow.program.assemble import prepare
from hybridflow.run.loop import Trainer
from hybridflow.run.tracking import new_run_dir
from tests.support.e2e import graph_file

RAY = ("runtime.name=ray", "runtime.torch_threads=1", "trainer.val_every=0",
       "data.batch_size=8", "rollout.n=4", "actor.mini_batch_size=32",
       "actor.micro_batch_size=16")
SHARDED_SPLIT = ("placement.pools.main.devices_per_node=2", "actor.strategy=fsdp2",
                 "placement.pools.gen.devices_per_node=2", "placement.roles.rollout=gen",
                 "rollout.weight_bucket_mb=0.02")  # ~20 KB: the toy model in many buckets


@pytest.mark.slow  # a Ray run on four workers (~40 s)
@pytest.mark.ray
@pytest.mark.usefixtures("ray_session")
def test_a_sharded_actor_syncs_a_split_rollout_bucket_by_bucket(tmp_path):
    loaded = prepare(graph_file("grpo"), [f"trainer.runs_dir={tmp_path}", *RAY,
                                          *SHARDED_SPLIT])
    trainer = Trainer(loaded, new_run_dir(str(tmp_path), "grpo"))
    try:
        for step in range(2):
            result = trainer.runtime.run_step({"prompts": trainer.train_loader.next_batch()})
            rows = trainer.runtime.fetch(result, "rollout.generate", ("policy_version",))
            assert set(rows["policy_version"].tolist()) == {step}
            metrics = result.metrics
            assert metrics["rollout/policy_version"] == step + 1  # the update's weights
            assert metrics["engine/weight_sync_bytes"] / 2 > 300_000  # two rollout ranks
            assert result.driver_bytes < metrics["engine/weight_sync_bytes"] / 2
    finally:
        trainer.close()
