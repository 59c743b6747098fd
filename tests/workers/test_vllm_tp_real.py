"""The `vllm` engine tensor-parallel (tp=2, SPMD: one engine per rank of a tp group, two
gloo ranks in two processes) against the same engine at tp=1, on real vLLM (the CPU
build, in .ci/vllm.sh's environment; skipped without vLLM). The toy model: 4 attention
heads, 2 key/value heads, head size 32."""
import os

import pytest
import torch

pytest.importorskip("vllm")

from tests.support.vllm_real import trainer_log_probs
from tests.support.vllm_tp import PROMPTS, WIDTH, new_weights, run_rank, scenario, toy_cfg
from tests.support.ports import free_port

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


@pytest.fixture(scope="module")
def tp2(tmp_path_factory):
    """Both ranks' results of the scenario at tp=2."""
    import torch.multiprocessing as mp
    out = str(tmp_path_factory.mktemp("tp2"))
    mp.spawn(run_rank, args=(2, free_port(), out), nprocs=2, join=True)
    return [torch.load(os.path.join(out, f"rank{r}.pt"), weights_only=False)
            for r in range(2)]


@pytest.fixture(scope="module")
def tp1():
    """The scenario at tp=1 in this process, and an actor (the trainer's forward) on the
    same checkpoint."""
    from hybridflow.workers import ActorWorker
    from hybridflow.workers.rollout.engine import EngineSpec, make_engine
    actor = ActorWorker(toy_cfg())
    engine = make_engine(EngineSpec(actor.model_cfg, actor.rollout_cfg, actor.tokenizer,
                                    actor.ctx, actor.device))
    assert engine.tp == 1
    return actor, scenario(engine, actor.tokenizer, actor.rollout_cfg, actor.model_cfg)


def _trainer_log_probs(actor, out, version_seed):
    """The actor's forward on the rollout's tokens under the weights of a version."""
    from tests.support.workers import prompt_batch
    from hybridflow.workers.rollout.generation import assemble_rollout
    if version_seed is not None:
        actor.module.load_state_dict(new_weights(actor.model_cfg, actor.tokenizer,
                                                 version_seed))
    prompts = prompt_batch(actor.tokenizer, PROMPTS).select("input_ids", "attention_mask")
    tok = actor.tokenizer
    rollout = assemble_rollout(prompts, out["responses"], tok.pad_token_id, tok.eos_token_id,
                               out["rollout_log_probs"])
    return trainer_log_probs(actor, rollout)


def test_a_tp_group_runs_one_engine_with_one_seed(tp2):
    """vLLM itself runs one tensor-parallel group of ranks 0 and 1 (each rank holding half
    the heads), with the group's one seed."""
    assert [r["tp"] for r in tp2] == [2, 2]
    assert [r["vllm_tp"] for r in tp2] == [(2, 0, [0, 1]), (2, 1, [0, 1])]
    assert tp2[0]["seed"] == tp2[1]["seed"]


@pytest.mark.parametrize("version", ["v0", "v1"], ids=["checkpoint", "after_a_sync"])
def test_greedy_tokens_and_log_probs_at_tp2_are_tp1s(tp1, tp2, version):
    """fp32: tp=2 gives tp=1's greedy tokens and its rollout_log_probs to 1e-4, on the
    checkpoint and after a weight sync in buckets smaller than a layer (each rank loads
    every full bucket; vLLM's loader shards it for the rank)."""
    _, ref = tp1
    for rank, result in enumerate(tp2):
        ours, theirs = result[version], ref[version]
        assert torch.equal(ours["responses"], theirs["responses"]), (version, rank)
        assert torch.equal(ours["response_mask"], theirs["response_mask"])
        assert theirs["response_mask"].sum() >= len(PROMPTS) * 2, "responses too short"
        diff = (ours["rollout_log_probs"] - theirs["rollout_log_probs"]).abs().max()
        assert diff < 1e-4, f"{version} rank {rank}: max |diff| {diff:.2e}"


def test_after_a_sync_tp2_log_probs_are_the_new_weights(tp1, tp2):
    """The synced weights are what the tp=2 engine scores with: its log-probs equal the
    trainer's forward under the new weights (prefix cache reset), not the old ones."""
    actor, _ = tp1
    out = tp2[0]["v1"]
    old = _trainer_log_probs(actor, out, None)
    new = _trainer_log_probs(actor, out, version_seed=1)
    mask = out["response_mask"].bool()
    assert (out["rollout_log_probs"] - new).abs().max() < 1e-4
    assert (out["rollout_log_probs"] - old)[mask].abs().max() > 1e-3, "sync not a change"


@pytest.mark.parametrize("part", ["sampled", "stream"])
def test_the_ranks_of_a_group_sample_and_stream_in_lockstep(tp2, part):
    """Sampling (the group's one seed) and a stream with a weight update landing while its
    requests are in flight give the same tokens, log-probs and versions on both ranks."""
    first, second = tp2[0][part], tp2[1][part]
    for key in first:
        assert torch.equal(first[key], second[key]), (part, key)
    if part == "stream":
        assert tp2[0]["stream_uid"] == tp2[1]["stream_uid"]
        versions = first["token_versions"][first["response_mask"].bool()]
        assert set(versions.tolist()) == {1, 2}, "the update did not land mid-stream"
        assert first["responses"].shape == (len(PROMPTS), WIDTH)


def test_ranks_of_a_group_given_different_rows_refuse_before_vllm_runs(tp2):
    """Both ranks raise (no rank enters vLLM's collectives with other rows: it would hang
    or mix the ranks' sequences)."""
    for result in tp2:
        assert result["refused"] is not None and "different rows" in result["refused"]
