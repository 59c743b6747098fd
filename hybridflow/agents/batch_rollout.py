"""A batch of prompt rows in, a rollout batch out: the body of the agent rollout node
(`agent.play`, worker.py).

`play_batch` takes the prompt loader's batch (its per-row columns: `raw_prompt`,
`uid`, `data_source`, `ground_truth`, `extra_info`, ...), plays one episode per row
(`n` per row, rows repeated interleaved like `rollout.generate`), and returns the
trajectory columns (trajectory.py), `scores`/`token_level_scores` from the
environment, `agent_status`, `policy_version`, the prompt's columns forwarded, and
the `agent/*` metrics in `meta["metrics"]` (how workers report metrics).

Stateless.
"""
from __future__ import annotations

import torch

from hybridflow.core.columns import POLICY_VERSION, TOKEN_VERSIONS, uniform_token_versions
from hybridflow.agents.runner import EpisodeRunner
from hybridflow.core.batch import Batch
from hybridflow.core.metric_names import SAMPLED_VERSION
from hybridflow.workers.rollout.engine import UNKNOWN_VERSION

__all__ = ["episode_rows", "play_batch", "AGENT_ROLLOUT_WRITES"]

AGENT_ROLLOUT_WRITES = ("prompts", "responses", "response_mask", "loss_mask", "input_ids",
                        "attention_mask", "position_ids", "response_length",
                        "rollout_log_probs", "scores", "token_level_scores", "agent_status",
                        POLICY_VERSION, TOKEN_VERSIONS)


def episode_rows(batch: Batch) -> list[dict]:
    """One dict per row of the batch's non-tensor columns (what an environment reads)."""
    columns = batch.non_tensors
    return [{key: values[i] for key, values in columns.items()} for i in range(len(batch))]


def play_batch(runner: EpisodeRunner, batch: Batch, pad_id: int, n: int = 1,
               prompt_width: int = 0, response_width: int = 0,
               policy_version: int = UNKNOWN_VERSION) -> Batch:
    """`policy_version`: of the weights the runner's generator samples with (the
    engine's), stamped on every row as `rollout.generate` does."""
    prompts = batch.repeat(n, interleave=True) if n > 1 else batch
    result = runner.run(episode_rows(prompts))
    out = result.to_batch(pad_id, prompt_width, response_width)
    out[POLICY_VERSION] = torch.full((len(out),), int(policy_version), dtype=torch.long)
    out[TOKEN_VERSIONS] = uniform_token_versions(out["response_mask"], policy_version)
    for key, values in prompts.non_tensors.items():
        if key not in out:
            out[key] = values
    # the version every episode of this call played with (async/staleness/*)
    out.meta = {**out.meta, "metrics": {**result.metrics,
                                        SAMPLED_VERSION: int(policy_version)}}
    return out
