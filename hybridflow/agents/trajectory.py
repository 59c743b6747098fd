"""A multi-turn trajectory kept as token ids end to end, and its rollout-batch layout.

The ids fed to the model for its next turn are `context_ids()`: the prompt's ids,
then every model turn exactly as sampled and every observation's ids, in order.
Nothing is ever decoded and re-encoded, so the tokens trained on are the tokens
sampled. `loss_mask` marks the model's tokens (1) and the observations' (0); it is
distinct from the attention mask, which covers both.

Layout (`layout_batch`), the engine's rollout layout (`hybridflow/workers/sequences.py`)
with the whole conversation after the prompt as the "response":
  prompts [B, P] left-padded; responses [B, R] right-padded;
  response_mask [B, R]   1 on every real response token (model and observation);
  loss_mask [B, R]       1 on model tokens only: what losses, advantages and KL use;
  input_ids, attention_mask, position_ids [B, P + R]; response_length [B];
  rollout_log_probs [B, R] the sampler's log-prob of each model token, 0 elsewhere.

State: a `Trajectory` holds its ids, mask and log-probs; it only grows.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from hybridflow.core.batch import Batch
from hybridflow.workers.sequences import position_ids_from_mask

__all__ = ["Trajectory", "layout_batch", "TRAJECTORY_COLUMNS"]

TRAJECTORY_COLUMNS = ("prompts", "responses", "response_mask", "loss_mask", "input_ids",
                      "attention_mask", "position_ids", "response_length",
                      "rollout_log_probs")


@dataclass
class Trajectory:
    prompt_ids: list[int]
    response_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    log_probs: list[float] = field(default_factory=list)
    model_turns: int = 0

    def context_ids(self) -> list[int]:
        """Exactly what the model is fed for its next turn."""
        return self.prompt_ids + self.response_ids

    def add_model_turn(self, ids: list[int], log_probs: list[float] | None = None) -> None:
        if log_probs is not None and len(log_probs) != len(ids):
            raise ValueError(f"a model turn of {len(ids)} tokens came with {len(log_probs)} "
                             "log-probs; a generator returns one per sampled token")
        self.response_ids += ids
        self.loss_mask += [1] * len(ids)
        self.log_probs += list(log_probs) if log_probs is not None else [0.0] * len(ids)
        self.model_turns += 1

    def add_observation(self, ids: list[int]) -> None:
        self.response_ids += ids
        self.loss_mask += [0] * len(ids)
        self.log_probs += [0.0] * len(ids)

    def model_token_ids(self) -> list[int]:
        """The model's sampled tokens, all turns in order (what the loss trains on)."""
        return [t for t, m in zip(self.response_ids, self.loss_mask) if m]

    def __len__(self) -> int:
        return len(self.response_ids)


def layout_batch(trajectories: list[Trajectory], pad_id: int, prompt_width: int = 0,
                 response_width: int = 0) -> Batch:
    """The rollout columns (see the module docstring), at least `prompt_width` x
    `response_width` wide (fixed widths let shards from every rank concatenate)."""
    rows = len(trajectories)
    p_width = max([prompt_width] + [len(t.prompt_ids) for t in trajectories])
    r_width = max([response_width] + [len(t) for t in trajectories])
    prompts = torch.full((rows, p_width), pad_id, dtype=torch.long)
    prompt_mask = torch.zeros_like(prompts)
    responses = torch.full((rows, r_width), pad_id, dtype=torch.long)
    response_mask, loss_mask = torch.zeros_like(responses), torch.zeros_like(responses)
    log_probs = torch.zeros(rows, r_width, dtype=torch.float32)
    for i, traj in enumerate(trajectories):
        n_prompt, n_resp = len(traj.prompt_ids), len(traj)
        if n_prompt:
            prompts[i, p_width - n_prompt:] = torch.tensor(traj.prompt_ids)
            prompt_mask[i, p_width - n_prompt:] = 1
        if n_resp:
            responses[i, :n_resp] = torch.tensor(traj.response_ids)
            response_mask[i, :n_resp] = 1
            loss_mask[i, :n_resp] = torch.tensor(traj.loss_mask)
            log_probs[i, :n_resp] = torch.tensor(traj.log_probs, dtype=torch.float32)
    attention_mask = torch.cat([prompt_mask, response_mask], dim=1)
    return Batch({
        "prompts": prompts, "responses": responses, "response_mask": response_mask,
        "loss_mask": loss_mask, "input_ids": torch.cat([prompts, responses], dim=1),
        "attention_mask": attention_mask,
        "position_ids": position_ids_from_mask(attention_mask),
        "response_length": response_mask.sum(-1), "rollout_log_probs": log_probs,
    })
