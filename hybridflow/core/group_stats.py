"""What a driver learns of a whole group of streamed samples (`GroupStats`): a few
sums, so a batch's means are exact whichever groups form it, and the oldest version,
which the buffer's admission rule reads. Computed where the rows wait (the rollout
worker, workers/rollout/stream_store.py); read by the run scheduler's ledger
(runtime/run_long/stream_buffer.py). Stateless."""
from __future__ import annotations

from dataclasses import astuple, dataclass

import torch

from hybridflow.core.batch import Batch
from hybridflow.core.columns import POLICY_VERSION, TOKEN_VERSIONS

__all__ = ["GroupStats", "group_stats"]


@dataclass(frozen=True)
class GroupStats:
    """What the driver learns of a whole group: sums, so a batch's means are exact
    whichever groups form it (staleness = trained version - mean version is linear)."""
    rows: int
    min_version: int          # the oldest `policy_version`: what admission reads
    version_sum: float        # sum of `policy_version` over rows
    length_sum: float         # sum of `response_length`
    token_version_sum: float  # sum of `token_versions` over real tokens
    tokens: int               # real tokens (token_versions >= 0)
    mixed_rows: int           # rows whose tokens span more than one version

    def as_tuple(self) -> tuple:
        return astuple(self)


def group_stats(rows: Batch) -> GroupStats:
    versions = rows[POLICY_VERSION].long()
    tokens = rows[TOKEN_VERSIONS]
    real = tokens >= 0
    top = tokens.masked_fill(~real, -1).amax(-1)
    low = tokens.masked_fill(~real, 1 << 30).amin(-1)
    mixed = (low != top) & real.any(-1)
    length = rows["response_length"].float().sum() if "response_length" in rows else \
        rows["response_mask"].float().sum() if "response_mask" in rows else torch.tensor(0.)
    return GroupStats(len(rows), int(versions.min()), float(versions.double().sum()),
                      float(length), float(tokens[real].double().sum()), int(real.sum()),
                      int(mixed.sum()))
