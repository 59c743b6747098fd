"""Streamed samples never pass through the driver (runtime/run_long/stream_client.py): on Ray,
with the rollout on a pool of its own, what a streaming step moves through the driver
(prompts to the ranks that generate them, poll replies with per-group numbers, the
uids a pass takes, group hashes) does not grow with the responses. Two runs whose
responses may be 16 or 64 tokens long move the same bytes through the driver to
within 10%, a few KB a step, while the samples themselves are several times larger
at 64 tokens."""
from __future__ import annotations

import pytest

from tests.support.async_runs import SPLIT, STREAM
from tests.support.e2e import series, train

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.usefixtures("ray_session")]

RAY = ("runtime.name=ray", "runtime.torch_threads=1")


def run(tmp_path, max_new_tokens: int) -> tuple[list[float], list[float]]:
    _, metrics = train("grpo", tmp_path / str(max_new_tokens), *STREAM, *RAY, *SPLIT,
                       "trainer.steps=3", "trainer.staleness=1", "actor.off_policy=decoupled",
                       f"rollout.max_new_tokens={max_new_tokens}")
    return series(metrics, "engine/driver_bytes"), series(metrics, "response_length/mean")


def test_driver_bytes_per_step_do_not_grow_with_the_responses(tmp_path):
    short, short_len = run(tmp_path, 16)
    long, long_len = run(tmp_path, 64)
    assert len(short) == len(long) == 3 and max(short_len) <= 16
    assert sum(long_len) > sum(short_len)  # the long run's samples were longer
    assert abs(sum(long) - sum(short)) < 0.1 * max(sum(long), sum(short)), (short, long)
    assert max(short + long) < 8 * 1024  # a few KB a step: prompts, numbers, uids
    # what the samples weigh: 16 rows a step, >= 6 int64 columns as wide as a response
    assert max(long) < 16 * 6 * 8 * sum(long_len) / len(long_len)
