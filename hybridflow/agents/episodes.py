"""Episodes and what a batch of them yields: a rollout batch, rewards and metrics.

An `Episode` ends in one of the `STATUSES`; every status but "done" scores 0 and is
counted in its metric, so bad input shows in the logs instead of killing the run:

    done          the environment said done; reward = the sum of its step rewards
    truncated     out of turns (`max_turns`) or tokens (the budget, or a model turn
                  that hit its token limit before its stop token)  -> agent/truncated_total
    env_error     the environment raised or returned garbage       -> agent/env_errors_total
    env_timeout   an environment call outlived its timeout         -> agent/env_timeouts_total
    tool_error    a malformed tool call, or the tool raised        -> agent/tool_errors_total

State: an Episode holds its row, environment, trajectory, reward so far and status
(None while it runs); the runner is the only writer.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from hybridflow.core.batch import Batch
from hybridflow.agents.trajectory import Trajectory, layout_batch

__all__ = ["Episode", "RolloutResult", "STATUSES", "EnvironmentFailedError"]

STATUSES = ("done", "truncated", "env_error", "env_timeout", "tool_error")
_STATUS_METRICS = {"truncated": "agent/truncated_total",  # counts: summed over ranks
                   "env_error": "agent/env_errors_total",
                   "env_timeout": "agent/env_timeouts_total",
                   "tool_error": "agent/tool_errors_total"}


class EnvironmentFailedError(RuntimeError):
    """The environment failed (raised or timed out) on every episode of a batch."""


@dataclass
class Episode:
    index: int
    row: dict
    env: Any = None
    trajectory: Trajectory | None = None
    reward: float = 0.0
    tool_calls: int = 0
    status: str | None = None
    error: str | None = None

    def finish(self, status: str, error: str | None = None) -> None:
        self.status, self.error = status, error
        if status != "done":
            self.reward = 0.0


@dataclass
class RolloutResult:
    episodes: list[Episode]
    generate_calls: int = 0
    generated_rows: int = 0
    metrics: dict[str, float] = field(default_factory=dict)

    def compute_metrics(self) -> dict[str, float]:
        eps, n = self.episodes, max(1, len(self.episodes))
        counts = {status: sum(e.status == status for e in eps) for status in STATUSES}
        trajs = [e.trajectory for e in eps if e.trajectory is not None]
        self.metrics = {
            "agent/episodes_total": float(len(eps)),
            "agent/turns/mean": sum(t.model_turns for t in trajs) / n,
            "agent/tool_calls/mean": sum(e.tool_calls for e in eps) / n,
            "agent/tool_calls_total": float(sum(e.tool_calls for e in eps)),
            "agent/reward/mean": sum(e.reward for e in eps) / n,
            "agent/response_tokens/mean": sum(len(t) for t in trajs) / n,
            "agent/generate_calls_total": float(self.generate_calls),
            "agent/generate_rows/mean": self.generated_rows / max(1, self.generate_calls),
            **{metric: float(counts[status]) for status, metric in _STATUS_METRICS.items()},
        }
        return self.metrics

    def to_batch(self, pad_id: int, prompt_width: int = 0, response_width: int = 0) -> Batch:
        """The rollout columns (`layout_batch`) plus `scores` [B], `token_level_scores`
        [B, R] (the score at the last model token) and `agent_status` per row. An
        episode that never got its prompt (reset failed) is an empty row."""
        trajs = [e.trajectory or Trajectory([]) for e in self.episodes]
        out = layout_batch(trajs, pad_id, prompt_width, response_width)
        scores = torch.tensor([e.reward for e in self.episodes], dtype=torch.float32)
        out["scores"] = scores
        out["token_level_scores"] = _at_last_model_token(scores, out["loss_mask"])
        out["agent_status"] = np.array([e.status for e in self.episodes], dtype=object)
        return out


def _at_last_model_token(scores: torch.Tensor, loss_mask: torch.Tensor) -> torch.Tensor:
    out = torch.zeros(loss_mask.shape, dtype=torch.float32)
    positions = torch.arange(loss_mask.shape[1]).expand_as(loss_mask)
    last = torch.where(loss_mask.bool(), positions, -1).max(-1).values if loss_mask.numel() \
        else torch.full((len(scores),), -1)
    rows = torch.nonzero(last >= 0).flatten()
    out[rows, last[rows]] = scores[rows]
    return out
