"""Streaming on real vLLM (the CPU build, in .ci/vllm.sh's environment; skipped without
vLLM): requests in vLLM's engine across a weight update, each token's behaviour
log-prob checked against the trainer's forward under the weights its version names."""
import copy

import pytest
import torch

pytest.importorskip("vllm")

from tests.support.vllm_real import nudge, trainer_log_probs, vllm_cfg
from tests.support.workers import PROMPTS, prompt_batch

pytestmark = pytest.mark.vllm

WIDTH = 16


def _actor(**rollout):
    from hybridflow.workers import ActorWorker
    return ActorWorker(vllm_cfg(rollout={"max_new_tokens": WIDTH, **rollout}))


def _opts(actor, **kw):
    from hybridflow.workers.rollout.generation import sampling_options
    return sampling_options(actor.rollout_cfg, **{"n": 1, "max_new_tokens": WIDTH,
                                                  "temperature": 1.0, **kw})


def _stream(actor, prompts, polls_before_update, partial):
    """Submit, poll a few steps, land new weights (version 1), drain; the rows and the
    weights of both versions."""
    from hybridflow.workers.rollout.weights import refresh_engine
    engine, bucket = actor.engine, actor._bucket_bytes()
    refresh_engine(engine, actor.module, 0, bucket)
    torch.manual_seed(0)
    engine.submit(prompts, _opts(actor))
    out = [engine.poll(polls_before_update)]
    old = copy.deepcopy(actor.module.state_dict())
    nudge(actor.module, seed=1, scale=0.2)
    refresh_engine(engine, actor.module, 1, bucket)
    while engine.stream_busy:
        out.append(engine.poll(1))
    from hybridflow.core.batch import Batch
    return engine, Batch.concat([b for b in out if b is not None]), old


def _log_probs_under(actor, rows, state):
    current = copy.deepcopy(actor.module.state_dict())
    actor.module.load_state_dict(state)
    try:
        return trainer_log_probs(actor, rows)
    finally:
        actor.module.load_state_dict(current)


@pytest.mark.parametrize("partial", [True, False], ids=["partial", "restart"])
def test_each_token_keeps_the_weights_that_sampled_it(partial):
    actor = _actor(partial=partial)
    prompts = prompt_batch(actor.tokenizer, PROMPTS).repeat(2, interleave=True)
    engine, rows, old = _stream(actor, prompts, polls_before_update=4, partial=partial)
    assert len(rows) == len(prompts) and not engine.llm.llm_engine.has_unfinished_requests()
    mask = rows["response_mask"].bool()
    versions = rows["token_versions"]
    new_lp = trainer_log_probs(actor, rows)
    old_lp = _log_probs_under(actor, rows, old)
    on_new, on_old = mask & versions.eq(1), mask & versions.eq(0)
    assert on_new.any(), "no token sampled after the update: not a test"
    diff_new = (rows["rollout_log_probs"] - new_lp)[on_new].abs().max()
    assert diff_new < 1e-4, f"tokens of version 1 vs the new weights: {diff_new:.2e}"
    if partial:
        assert on_old.any() and engine.stream_counts()["mixed_rows"] > 0
        diff_old = (rows["rollout_log_probs"] - old_lp)[on_old].abs().max()
        assert diff_old < 1e-4, f"tokens of version 0 vs the old weights: {diff_old:.2e}"
        # the versions of a row never go down along its response
        for row, m in zip(versions, mask):
            seq = row[m].tolist()
            assert seq == sorted(seq)
    else:
        assert not on_old.any() and rows["policy_version"].eq(1).all()
        assert engine.stream_counts()["restarts"] > 0


def test_greedy_streaming_gives_generates_tokens():
    actor = _actor()
    batch = prompt_batch(actor.tokenizer, PROMPTS)
    want = actor.generate(batch, do_sample=False)
    engine = actor.engine
    engine.submit(batch, _opts(actor, do_sample=False))
    from hybridflow.core.batch import Batch
    got = []
    while engine.stream_busy:
        out = engine.poll(2)
        if out is not None:
            got.append(out)
    rows = Batch.concat(got)
    order = [list(rows["uid"]).index(u) for u in batch["uid"]]
    rows = rows.take(order)
    assert torch.equal(rows["responses"], want["responses"])
    assert torch.equal(rows["response_mask"], want["response_mask"])
    assert rows["token_versions"][rows["response_mask"].bool()].eq(actor.policy_version).all()
