"""Response lengths: a lognormal of a given mean and shape, capped at the max tokens.

Decode time depends on two numbers of the distribution: the mean (how many
tokens a replica decodes in total) and the tail (the longest of the sequences a
replica decodes, which it cannot finish before). With `response_mean == 0`
every response is `response_len` long, mean and tail alike. Stateless.
"""
from __future__ import annotations

import math
from statistics import NormalDist

from .problem import Workload


def expected_longest(work: Workload, count: int) -> float:
    """Expected length of the longest of `count` responses (the max over them, capped)."""
    if not work.response_mean or work.response_sigma == 0 or count <= 1:
        return work.mean_response_len
    sigma = work.response_sigma
    mu = math.log(work.response_mean) - sigma * sigma / 2
    quantile = count / (count + 1)  # where the largest of `count` samples sits on average
    longest = math.exp(mu + sigma * NormalDist().inv_cdf(quantile))
    return _cap(work, max(longest, work.response_mean))


def _cap(work: Workload, tokens: float) -> float:
    return min(float(work.response_len), tokens)
