"""actor.update without a loss from the graph takes the off-policy correction from its
config (`actor.off_policy`): the behaviour log-probs the rollout wrote reach the
default loss, and a batch without them is refused naming the key."""
import pytest

from hybridflow.graph.dispatch import method_spec
from hybridflow.workers import ActorWorker
from tests.support.workers import make_cfg, rollout_for_update


def test_the_config_chosen_loss_corrects_with_the_rollouts_log_probs():
    actor = ActorWorker(make_cfg(actor={"off_policy": "decoupled", "is_cap": 1.5}))
    data = rollout_for_update(actor)
    metrics = actor.update(data).meta["metrics"]
    # same weights sampled and scored the batch: every weight ~1, none dropped
    assert metrics["actor/off_policy/is_weight_mean"] == pytest.approx(1.0, abs=1e-5)
    assert metrics["actor/off_policy/dropped_frac"] == 0.0
    # the engine passes the column to the update, where the default loss finds it
    assert "rollout_log_probs" in method_spec(ActorWorker, "update").optional


def test_a_corrected_update_without_the_behaviour_log_probs_names_them():
    actor = ActorWorker(make_cfg(actor={"off_policy": "tis"}))
    data = rollout_for_update(actor)
    data.pop("rollout_log_probs")
    with pytest.raises(KeyError, match="rollout_log_probs"):
        actor.update(data)
