"""Watching a run's step metrics for a run that cannot learn, said once on the console.

`ZeroSignalWatch`: when nearly every group's responses get the same score
(`critic/score/frac_zero_std` >= `threshold` for `steps` steps in a row), their
group-relative advantages are 0 and the updates teach nothing; a reward that stays
flat says nothing about why. The watch says so once, naming the metric and what to
change. State: the current run of such steps and whether it has warned (it warns
once a run, never per step).
"""
from __future__ import annotations

from hybridflow.core.metric_names import ZERO_STD_GROUPS

__all__ = ["ZeroSignalWatch"]


class ZeroSignalWatch:
    def __init__(self, say, threshold: float = 0.95, steps: int = 5):
        self.say, self.threshold, self.steps = say, threshold, steps
        self.streak = 0
        self.warned = False

    def update(self, step: int, metrics: dict) -> None:
        value = metrics.get(ZERO_STD_GROUPS)
        if not isinstance(value, (int, float)):
            return  # a graph without group-relative advantages
        self.streak = self.streak + 1 if value >= self.threshold else 0
        if self.streak >= self.steps and not self.warned:
            self.warned = True
            self.say(f"warning: {ZERO_STD_GROUPS}={value:.2f} for {self.streak} steps in a "
                     f"row (to step {step}): in nearly every group all responses got the same "
                     f"score, so their advantages are 0 and the updates learn nothing from "
                     f"them. Raise rollout.temperature (more varied samples) or rollout.n "
                     f"(more samples a prompt), or give the scorer partial credit (a format "
                     f"score) so that answers differ")
