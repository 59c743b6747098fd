"""The rollout role colocated with the actor or on a pool of its own, end to end on
the local runtime: same seed, same training; the weight sync is in the plan, timed
and counted only when the rollout holds its own weights; every row knows which
policy version sampled it, across a resume too."""
import pytest

from hybridflow.program.assemble import prepare
from hybridflow.run.loop import Trainer
from hybridflow.run.tracking import RunDir, new_run_dir
from tests.support.e2e import graph_file, series, train
from tests.support.runs import FAST, stable

SPLIT = ("placement.pools.gen.devices_per_node=1", "placement.roles.rollout=gen")
SYNC_ONLY = ("engine/weight_sync_bytes", "rollout/weight_load_s", "rollout/policy_version",
             "actor/policy_version", "engine/weight_bytes")


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
def test_split_rollout_learns_the_toy_task_as_well_as_colocated(tmp_path):
    runs = {}
    for name, extra in (("colocated", ()), ("split", SPLIT)):
        _, metrics = train("grpo", tmp_path / name, "trainer.steps=30", "trainer.val_every=15",
                           *extra)
        runs[name] = series(metrics, "val/toy_arith/greedy")
    assert runs["split"][-1] >= runs["split"][0] + 0.4, runs
    assert abs(runs["split"][-1] - runs["colocated"][-1]) <= 0.05, runs


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
