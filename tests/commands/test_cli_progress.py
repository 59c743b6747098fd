"""`hybridflow run`'s progress bar shows the reward the update optimises: after the
graph's shaping (KL in the reward, DAPO's overlong penalty) when a node shapes it,
the reward worker's score otherwise."""
from __future__ import annotations

import pytest

from hybridflow.commands.run import progress_fields
from tests.support.e2e import series, train


def test_the_bar_prefers_the_shaped_reward_to_the_raw_score():
    shaped = {"critic/score/mean": 0.5, "critic/rewards/mean": 0.25, "actor/pg_loss": 0.1,
              "val/toy_arith/mean": 0.75, "perf/time_per_step": 2.0}
    assert progress_fields(shaped) == {"reward": 0.25, "pg_loss": 0.1, "toy_arith": 0.75}
    assert progress_fields({"critic/score/mean": 0.5}) == {"reward": 0.5}  # nothing shapes it
    assert progress_fields({"actor/sft_loss": 1.0}) == {}  # no reward at all (SFT)


@pytest.mark.parametrize("name, overrides", [
    # the actor moves after step 1, so step 2's KL to the reference shapes the reward
    ("ppo", ["trainer.steps=2", "algorithm.kl_coef=0.5", "actor.lr=1e-4"]),
    # a buffer as long as the responses: every response loses some of its score
    ("dapo", ["trainer.steps=1", "algorithm.overlong_buffer=16", "rollout.max_new_tokens=16",
              "algorithm.max_rounds=0"]),
])
def test_a_step_logs_the_shaped_reward_and_the_bar_shows_it(tmp_path, name, overrides):
    _, metrics = train(name, tmp_path, "trainer.val_every=0", *overrides)
    last = metrics[-1]
    shaped, raw = last["critic/rewards/mean"], last["critic/score/mean"]
    assert shaped != pytest.approx(raw), (shaped, raw)
    if name == "dapo":
        assert shaped < raw  # the overlong penalty only takes away
    assert progress_fields(last)["reward"] == shaped
    assert len(series(metrics, "critic/rewards/mean")) == len(metrics)
