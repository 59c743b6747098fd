"""Issue 32, class 10 (groups that teach nothing): the share of groups whose responses
all got the same score is a step metric of every group-relative advantage
(`critic/score/frac_zero_std`, TRL's `frac_reward_zero_std`), and `hybridflow run`
warns once when it stays near 1, naming the metric and what to change."""
from __future__ import annotations

import pytest
import torch

from algorithms.advantages import zero_std_fraction
from graphs import ops
from hybridflow import ZERO_STD_GROUPS, Batch
from hybridflow.commands.run_watch import ZeroSignalWatch


def test_the_fraction_counts_groups_with_one_score():
    scores = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.0, 0.0, 0.5])
    uid = ["a", "a", "b", "b", "c", "c", "d"]  # d: a group of one is not counted
    assert zero_std_fraction(scores, uid) == pytest.approx(2 / 3)
    assert zero_std_fraction(torch.tensor([1.0, 2.0]), ["a", "b"]) == 0.0


@pytest.mark.parametrize("node", [ops.grpo_advantages, ops.rloo_advantages,
                                  ops.reinforce_pp_baseline_advantages])
def test_every_group_relative_advantage_logs_it(node):
    batch = Batch({"scores": torch.tensor([1.0, 1.0, 0.0, 1.0]),
                   "response_mask": torch.ones(4, 3)})
    batch["uid"] = ["p", "p", "q", "q"]
    out = node(batch)
    assert out.meta["metrics"][ZERO_STD_GROUPS] == pytest.approx(0.5)


def test_the_run_warns_once_when_it_stays_near_one():
    said = []
    watch = ZeroSignalWatch(said.append, threshold=0.95, steps=3)
    for step, value in enumerate([1.0, 1.0, 0.5, 1.0, 0.97, 1.0, 1.0, 1.0, 1.0], 1):
        watch.update(step, {ZERO_STD_GROUPS: value})
    assert len(said) == 1, said  # the streak is reset at 0.5; once, not per step
    assert ZERO_STD_GROUPS in said[0] and "step 6" in said[0]
    assert all(word in said[0] for word in ("rollout.temperature", "rollout.n", "scorer"))
    watch.update(10, {})  # a graph without the metric: nothing said
    assert len(said) == 1
