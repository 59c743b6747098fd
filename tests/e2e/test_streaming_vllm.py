"""Streaming rollout with rollout.backend=vllm end to end, against real vLLM (the CPU
build, in .ci/vllm.sh's environment; skipped without vLLM): the requests live in
vLLM's engine while the actor trains, weight updates land while they are in flight,
and what the update reads is admitted per sample and per token, on the local runtime
(colocated: the actor's engine, refreshed before each poll; split: the rollout's own
engine fed by the weight-sync edge) and on Ray (the engine loop on the rollout
worker's own thread). As on Ray with the `hf` engine, which samples finish before
which update depends on timing there; the invariants are what is checked."""
from __future__ import annotations

import pytest

pytest.importorskip("vllm")

from tests.support.async_runs import SPLIT, STREAM, check_rows, run_recording, trained_uids
from tests.support.vllm_real import VLLM_RUN

pytestmark = pytest.mark.vllm

HEAD32 = ("model.path=null", "model.hf_config.num_attention_heads=2",
          "model.hf_config.num_key_value_heads=1", "model.hf_config.head_dim=32")
# 8 sequences a vLLM step (async_runs.STREAM's 16 requests a batch): some wait, so requests are
# in flight whenever an update lands
RUN = (*VLLM_RUN, *HEAD32, "actor.off_policy=decoupled", "rollout.max_model_len=64",
       "rollout.max_num_seqs=8")


def _check(trainer, seen, k, steps):
    check_rows(seen, k)
    uids = trained_uids(seen)
    assert len(uids) == len(set(uids)) == 4 * steps  # whole groups, each trained once
    metrics = [m for _, m, _ in seen.values()]
    assert metrics[-1]["async/stream/decode_steps"] > 0
    assert trainer.run.status()["state"] == "finished"
    return metrics


@pytest.mark.parametrize("partial", [True, False], ids=["partial", "restart"])
def test_vllm_streams_colocated_on_the_local_runtime(tmp_path, partial):
    trainer, seen = run_recording(tmp_path, *STREAM, *RUN, "trainer.steps=4", "trainer.staleness=1",
                                  f"rollout.partial={str(partial).lower()}")
    metrics = _check(trainer, seen, 1, 4)
    if partial:  # responses continued across updates, and were trained behind them
        assert sum(m["async/mixed_version_rows"] for m in metrics) > 0
        assert max(m["async/staleness/max"] for m in metrics) >= 1
    else:  # what was in flight at an update restarted: one version a response
        assert sum(m["async/mixed_version_rows"] for m in metrics) == 0
        assert metrics[-1]["async/stream/restarts"] > 0


def test_vllm_streams_with_the_rollout_on_its_own_pool_locally(tmp_path):
    trainer, seen = run_recording(tmp_path, *STREAM, *RUN, *SPLIT, "trainer.steps=4",
                                  "trainer.staleness=2")
    metrics = _check(trainer, seen, 2, 4)
    assert metrics[-1]["engine/weight_sync_bytes"] > 0  # the rollout's own copy was fed
    assert max(m["async/staleness/max"] for m in metrics) >= 1


@pytest.mark.slow  # a Ray run
@pytest.mark.ray
@pytest.mark.usefixtures("ray_session")
def test_vllm_streams_on_ray_in_the_rollout_workers_thread(tmp_path):
    trainer, seen = run_recording(tmp_path, *STREAM, *RUN, *SPLIT, "trainer.steps=4",
                                  "trainer.staleness=1", "runtime.name=ray",
                                  "runtime.torch_threads=1")
    assert trainer.scheduler.source.background
    metrics = _check(trainer, seen, 1, 4)
    assert metrics[-1]["engine/weight_sync_bytes"] > 0


@pytest.mark.slow  # a training run
def test_grpo_learns_streaming_with_vllm(tmp_path):
    from tests.support.e2e import series, train
    trainer, metrics = train("grpo", tmp_path, *VLLM_RUN, "rollout.max_model_len=64",
                             "trainer.steps=12", "trainer.val_every=12", "trainer.val_samples=1",
                             "trainer.staleness=1", "trainer.async_mode=streaming",
                             "actor.off_policy=tis")
    accuracy = series(metrics, "val/toy_arith/greedy")
    assert accuracy[0] <= 0.2 and accuracy[-1] >= 0.8, accuracy
    assert max(series(metrics, "async/staleness/max")) >= 1
    assert trainer.run.status()["state"] == "finished"
