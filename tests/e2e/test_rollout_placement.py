"""The rollout role colocated with the actor or on a pool of its own, end to end: same
seed, same training on the local runtime; the weight sync is in the plan, timed and
counted only when the rollout holds its own weights; every row knows which policy
version sampled it, across a resume too. On Ray the export moves actor -> rollout as
an object reference (not through the driver), and on both runtimes GRPO learns as well
split as colocated."""
import pytest

from hybridflow.program.assemble import prepare
from hybridflow.run.loop import Trainer
from hybridflow.run.tracking import RunDir, new_run_dir
from tests.support.e2e import graph_file, series, train
from tests.support.runs import FAST, stable

SPLIT = ("placement.pools.gen.devices_per_node=1", "placement.roles.rollout=gen")
SYNC_ONLY = ("engine/weight_sync_bytes", "rollout/weight_load_s", "rollout/policy_version",
             "actor/policy_version", "engine/weight_bytes")
RAY_FAST = ("runtime.name=ray", "runtime.torch_threads=1", "trainer.val_every=0",
            "data.batch_size=8", "rollout.n=4", "actor.mini_batch_size=32",
            "actor.micro_batch_size=32")
RAY_SPLIT = ("placement.pools.gen.devices_per_node=2", "placement.roles.rollout=gen")
RAY_TWO = ("placement.pools.main.devices_per_node=2",)
# Per runtime: the runs' overrides, colocated and split, the held-out accuracy the split
# run must gain, and how far below the colocated one it may end.
LEARNS = {
    "local": (("trainer.steps=30", "trainer.val_every=15"), (), SPLIT, 0.4, 0.05),
    # separate processes draw different samples, so "as well" is to a wider tolerance
    "ray": (("runtime.name=ray", "runtime.torch_threads=1", "trainer.steps=12",
             "trainer.val_every=12", "trainer.val_samples=1"),
            RAY_TWO, (*RAY_TWO, *RAY_SPLIT), 0.3, 0.15),
}


def _stable(metrics):
    """Metrics that do not depend on wall-clock time or on where the rollout lives."""
    return [{k: v for k, v in m.items() if k not in SYNC_ONLY} for m in stable(metrics)]


def test_split_rollout_trains_exactly_as_colocated_with_one_seed(tmp_path):
    _, colocated = train("grpo", tmp_path / "a", "trainer.steps=3", *FAST)
    _, split = train("grpo", tmp_path / "b", "trainer.steps=3", *FAST, *SPLIT)
    for a, b in zip(_stable(split), _stable(colocated), strict=True):
        assert a.keys() == b.keys()
        assert a == pytest.approx(b, rel=1e-6, abs=1e-5)  # the probability mismatch is noise
    for m in split:  # the sync ran after every update: bytes moved, load timed
        assert m["engine/weight_sync_bytes"] > 0 and m["timing_s/weight_sync"] >= 0
        assert m["rollout/policy_version"] == m["step"]
    for m in colocated:
        assert "engine/weight_sync_bytes" not in m and "timing_s/weight_sync" not in m
    # the split run holds a second copy of the weights
    assert split[0]["engine/weight_bytes"] > colocated[0]["engine/weight_bytes"]


@pytest.mark.slow
def test_split_rollout_learns_the_toy_task_as_well_as_colocated(tmp_path, runtime_name,
                                                               shared_runs):
    common, colocated, split, gain, below = LEARNS[runtime_name]
    # the colocated run is test_learning's GRPO run (same overrides): trained once
    _, metrics = shared_runs.train("grpo", *common, *colocated)
    accuracy = {"colocated": series(metrics, "val/toy_arith/greedy")}
    _, metrics = train("grpo", tmp_path / "split", *common, *split)
    accuracy["split"] = series(metrics, "val/toy_arith/greedy")
    first, last = accuracy["split"][0], accuracy["split"][-1]
    assert last >= first + gain, accuracy
    assert last >= accuracy["colocated"][-1] - below, accuracy
    if runtime_name == "local":  # one process, one sampler: not above the colocated either
        assert last <= accuracy["colocated"][-1] + below, accuracy


def _versions_per_step(tmp_path, steps: int, *overrides, resume=None):
    """policy_version of the rows `rollout.generate` produced, for each step run."""
    loaded = prepare(graph_file("grpo"), [f"trainer.runs_dir={tmp_path}", *FAST,
                                          f"trainer.steps={steps}", *overrides])
    run = RunDir(resume) if resume else new_run_dir(str(tmp_path), "grpo")
    trainer = Trainer(loaded, run, resume_from=resume)
    seen = []
    try:
        while trainer.step < steps:
            trainer.step += 1
            feeds = {"prompts": trainer.train_loader.next_batch()}
            result = trainer.runtime.run_step(feeds)
            rows = trainer.runtime.fetch(result, "rollout.generate", ("policy_version",))
            seen.append(sorted(set(rows["policy_version"].tolist())))
        trainer.save()
    finally:
        trainer.close()
    return seen, run.path


@pytest.mark.parametrize("placement", [(), SPLIT], ids=["colocated", "split"])
def test_each_row_carries_the_updates_its_weights_had_seen(tmp_path, placement):
    seen, path = _versions_per_step(tmp_path, 2, *placement)
    assert seen == [[0], [1]]
    resumed, _ = _versions_per_step(tmp_path, 3, *placement, resume=path)
    assert resumed == [[2]]  # the count survives the checkpoint; a split rollout is resynced


@pytest.mark.slow  # Ray training runs (~35 s)
@pytest.mark.ray
@pytest.mark.usefixtures("ray_session")
def test_split_rollout_syncs_worker_to_worker_and_stamps_versions(tmp_path):
    loaded = prepare(graph_file("grpo"), [f"trainer.runs_dir={tmp_path}", *RAY_FAST,
                                          *RAY_SPLIT])
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


@pytest.mark.slow  # Ray training runs (~35 s)
@pytest.mark.ray
@pytest.mark.usefixtures("ray_session")
def test_a_resumed_split_rollout_run_samples_what_an_uninterrupted_one_does(tmp_path):
    """The rollout's own process keeps sampling generators no role checkpoint holds:
    the run saves and restores them (rng/<role> in the checkpoint)."""
    args = (*RAY_FAST, *RAY_SPLIT)
    _, whole = train("grpo", tmp_path / "whole", "trainer.steps=3", *args)
    trainer, _ = train("grpo", tmp_path / "part", "trainer.steps=2", *args)
    _, resumed = train("grpo", tmp_path / "part", "trainer.steps=3", *args,
                       resume=trainer.run.path)
    assert stable(resumed) == stable(whole)
