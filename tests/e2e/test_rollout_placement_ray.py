"""The rollout on its own pool on Ray: the export moves actor -> rollout as an object
reference (not through the driver), the rows carry the right policy versions, and
GRPO learns as well as colocated."""
import pytest

from hybridflow.program.assemble import prepare
from hybridflow.run.loop import Trainer
from hybridflow.run.tracking import new_run_dir
from tests.support.e2e import graph_file, series, train

# Ray training runs are slow-tier (tests/support/costs.py): ~35 s and ~70 s here
pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.usefixtures("ray_session")]

FAST = ("runtime.name=ray", "runtime.torch_threads=1", "trainer.val_every=0",
        "data.batch_size=8", "rollout.n=4", "actor.mini_batch_size=32",
        "actor.micro_batch_size=32")
SPLIT = ("placement.pools.gen.devices_per_node=2", "placement.roles.rollout=gen")


def test_split_rollout_syncs_worker_to_worker_and_stamps_versions(tmp_path):
    loaded = prepare(graph_file("grpo"), [f"trainer.runs_dir={tmp_path}", *FAST, *SPLIT])
    trainer = Trainer(loaded, new_run_dir(str(tmp_path), "grpo"))
    try:
        for step in range(2):
            result = trainer.runtime.run_step({"prompts": trainer.train_loader.next_batch()})
            rows = trainer.runtime.fetch(result, "rollout.generate", ("policy_version",))
            assert set(rows["policy_version"].tolist()) == {step}
            metrics = result.metrics
            exported = metrics["engine/weight_sync_bytes"] / 2  # two rollout ranks
            assert exported > 300_000 and "timing_s/weight_sync" in metrics
            assert metrics["rollout/policy_version"] == step + 1
            # the feeds cross the driver; the weights (larger than all of it) do not
            assert result.driver_bytes < exported
    finally:
        trainer.close()


def test_grpo_with_the_rollout_on_its_own_pool_learns_as_well_as_colocated(tmp_path):
    common = ("runtime.name=ray", "runtime.torch_threads=1", "trainer.steps=12",
              "trainer.val_every=12", "trainer.val_samples=1")
    accuracy = {}
    for name, placement in (("colocated", ("placement.pools.main.devices_per_node=2",)),
                            ("split", ("placement.pools.main.devices_per_node=2", *SPLIT))):
        _, metrics = train("grpo", tmp_path / name, *common, *placement)
        accuracy[name] = series(metrics, "val/toy_arith/greedy")
    first, last = accuracy["split"][0], accuracy["split"][-1]
    assert last >= first + 0.3, accuracy
    # separate processes draw different samples, so "as well" is to a tolerance
    assert last >= accuracy["colocated"][-1] - 0.15, accuracy


def test_a_resumed_split_rollout_run_samples_what_an_uninterrupted_one_does(tmp_path):
    """The rollout's own process keeps sampling generators no role checkpoint holds:
    the run saves and restores them (rng/<role> in the checkpoint)."""
    from tests.support.runs import stable
    args = (*FAST, *SPLIT)
    _, whole = train("grpo", tmp_path / "whole", "trainer.steps=3", *args)
    trainer, _ = train("grpo", tmp_path / "part", "trainer.steps=2", *args)
    _, resumed = train("grpo", tmp_path / "part", "trainer.steps=3", *args,
                       resume=trainer.run.path)
    assert stable(resumed) == stable(whole)
