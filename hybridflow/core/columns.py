"""Names of the columns the engine itself reads on rows (not metrics: metric_names.py),
defined once: the weights version that sampled each row and each token, and the
engine's log-probs of the tokens it sampled.

- `policy_version` [B] int64: the version of the weights that sampled the row (its
  oldest token's, when a partial rollout spans a weight update);
- `token_versions` [B, R] int64: the version that sampled each response token,
  `NO_TOKEN` on padding. Every generate call writes both (synchronously every token
  has the row's version; streaming engines stamp each token as they sample it), so
  any node may read them;
- `rollout_log_probs` [B, R] float32: the log-prob of each sampled token under the
  distribution the engine sampled from (0 on padding).
`STREAM_COLUMNS`: what every generate method of a role that streams writes (checked
by the compiler, plan/streaming_split.py): the streaming buffer admits rows by their
versions, and off-policy losses correct by the engine's log-probs.
Stateless.
"""
from __future__ import annotations

import torch

__all__ = ["POLICY_VERSION", "TOKEN_VERSIONS", "ROLLOUT_LOG_PROBS", "STREAM_COLUMNS",
           "NO_TOKEN", "uniform_token_versions"]

POLICY_VERSION = "policy_version"
TOKEN_VERSIONS = "token_versions"
ROLLOUT_LOG_PROBS = "rollout_log_probs"
STREAM_COLUMNS = (POLICY_VERSION, TOKEN_VERSIONS, ROLLOUT_LOG_PROBS)
NO_TOKEN = -1  # `token_versions` on padding (a response's positions after its end)


def uniform_token_versions(response_mask: torch.Tensor, version: int) -> torch.Tensor:
    """`token_versions` of responses sampled wholly by one weights version."""
    return torch.where(response_mask.bool(), int(version), NO_TOKEN).long()
