"""GRPO on Ray with the vLLM rollout tensor-parallel (tp=2: one engine over a tp group of
two ranks, SPMD), against real vLLM (the CPU build, in .ci/vllm.sh's environment;
skipped without vLLM): on a pool of its own fed by the weight-sync edge it learns the
toy task and streams (a tp group steps inline, in the driver's order); colocated with a
tp=2 actor (fsdp2 over a (dp 1, tp 2) mesh) in the same two processes it learns too."""
import pytest

pytest.importorskip("vllm")

from tests.support.e2e import series, train
from tests.support.vllm_real import VLLM_RUN

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.ray,
              pytest.mark.usefixtures("ray_session")]

RAY = ("runtime.name=ray", "runtime.torch_threads=1")
TP2_POOL = ("placement.pools.gen.devices_per_node=2", "placement.roles.rollout=gen",
            "placement.parallel.rollout.tp=2")
VAL = "val/toy_arith/greedy"


def test_grpo_learns_with_a_tp2_vllm_rollout_on_its_own_pool(tmp_path):
    trainer, metrics = train("grpo", tmp_path, *VLLM_RUN, *RAY, *TP2_POOL,
                             "rollout.max_model_len=64", "trainer.steps=12",
                             "trainer.val_every=12", "trainer.val_samples=1")
    assert trainer.run.status()["state"] == "finished"
    assert set(series(metrics, "rollout/engine_tp")) == {2}  # the synced engine: tp=2
    assert series(metrics, "rollout/policy_version")[-1] >= 11
    accuracy = series(metrics, VAL)
    assert accuracy[0] <= 0.2 and accuracy[-1] >= 0.9, accuracy


def test_a_tp2_vllm_rollout_streams_on_its_own_pool(tmp_path):
    from tests.support.async_runs import STREAM, check_rows, run_recording, trained_uids
    trainer, seen = run_recording(tmp_path, *STREAM, *VLLM_RUN, *RAY, *TP2_POOL,
                                  "rollout.max_model_len=64", "rollout.max_num_seqs=8",
                                  "actor.off_policy=decoupled", "trainer.steps=3",
                                  "trainer.staleness=1")
    check_rows(seen, 1)
    uids = trained_uids(seen)
    assert len(uids) == len(set(uids)) == 4 * 3  # whole groups, each trained once
    metrics = [m for _, m, _ in seen.values()]
    assert metrics[-1]["async/stream/decode_steps"] > 0
    assert metrics[-1]["rollout/engine_tp"] == 2
    assert trainer.run.status()["state"] == "finished"


def test_grpo_learns_with_a_tp2_actor_and_its_colocated_tp2_vllm_engine(tmp_path):
    trainer, metrics = train("grpo", tmp_path, *VLLM_RUN, *RAY,
                             "placement.pools.main.devices_per_node=2",
                             "placement.parallel.actor.tp=2", "actor.strategy=fsdp2",
                             "rollout.max_model_len=64", "trainer.steps=12",
                             "trainer.val_every=12", "trainer.val_samples=1")
    assert trainer.run.status()["state"] == "finished"
    accuracy = series(metrics, VAL)
    assert accuracy[0] <= 0.2 and accuracy[-1] >= 0.9, accuracy
