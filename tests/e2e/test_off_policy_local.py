"""The embedded GRPO graph with an off-policy correction, end to end on the local
runtime: the update reads `rollout_log_probs`, the off_policy/ metrics reach the run's
metric lines, and, trained synchronously with the HF engine (rollout and trainer
log-probs agree to ~1e-6), every weight is ~1: nothing truncated or dropped, the
behaviour-proximal KL ~0, and the loss that of the uncorrected run."""
from __future__ import annotations

import pytest

from hybridflow.program.assemble import prepare
from tests.support.e2e import graph_file, series, train

SMALL = ("trainer.steps=2", "trainer.val_every=0", "data.batch_size=4", "rollout.n=4",
         "actor.mini_batch_size=16", "actor.micro_batch_size=16")


def _update_reads(*overrides: str, tmp_path) -> tuple[str, ...]:
    loaded = prepare(graph_file("grpo"), [f"trainer.runs_dir={tmp_path}", *overrides])
    return next(n for n in loaded.plan.nodes if n.method == "update").reads


def test_the_compiled_update_reads_the_behaviour_log_probs_only_when_corrected(tmp_path):
    assert "rollout_log_probs" in _update_reads("actor.off_policy=tis", tmp_path=tmp_path)
    assert "rollout_log_probs" not in _update_reads(tmp_path=tmp_path)


@pytest.fixture(scope="module")
def uncorrected(tmp_path_factory):
    return train("grpo", tmp_path_factory.mktemp("none"), *SMALL)[1]


@pytest.mark.parametrize("correction, frac", [("tis", "truncated_frac"),
                                              ("decoupled", "dropped_frac")])
def test_synchronous_grpo_with_a_correction_has_unit_weights(correction, frac, tmp_path,
                                                               uncorrected):
    _, metrics = train("grpo", tmp_path, *SMALL, f"actor.off_policy={correction}")
    assert len(series(metrics, "actor/pg_loss")) == 2
    for key in ("is_weight_mean", "is_weight_max"):
        assert series(metrics, f"actor/off_policy/{key}") == pytest.approx([1.0, 1.0], abs=1e-5)
    assert series(metrics, f"actor/off_policy/{frac}") == [0.0, 0.0]
    assert all(0 <= kl < 1e-9 for kl in series(metrics, "actor/off_policy/behav_kl"))
    assert not any("off_policy" in key for line in uncorrected for key in line)
    # same seed, same first rollout: the weights ~1 leave the loss as it was
    assert series(metrics, "actor/pg_loss")[0] == pytest.approx(
        series(uncorrected, "actor/pg_loss")[0], rel=1e-4, abs=1e-6)


def test_async_grpo_with_a_correction_is_accepted_and_sees_the_stale_samples(tmp_path):
    """trainer.staleness=1: step 1 trains on fresh samples, later steps on samples one
    update old, so only then do the weights move off 1 and the KL off 0."""
    _, metrics = train("grpo", tmp_path, *SMALL[1:], "trainer.steps=3", "trainer.staleness=1",
                       "actor.off_policy=decoupled")
    kl = series(metrics, "actor/off_policy/behav_kl")
    assert series(metrics, "async/staleness/max") == [0.0, 1.0, 1.0]
    assert kl[0] < 1e-9 and min(kl[1:]) > 1e-6
    assert series(metrics, "actor/off_policy/is_weight_max")[1] > 1.0 + 1e-4
