"""The HF engine's streaming calls (submit / poll / abort, stream.py): continuous
batching refills slots as sequences end, a weight update lands while requests are in
flight, and each token keeps the version and behaviour log-prob it was sampled with
(partial rollouts) or the sequences in flight restart (`rollout.partial=false`)."""
import pytest
import torch

from hybridflow.workers import ActorWorker
from hybridflow.workers.rollout.generation import sampling_options
from hybridflow.workers.rollout.stream import NO_TOKEN
from tests.support.workers import PROMPTS, make_cfg, prompt_batch


@pytest.fixture
def actor():
    return ActorWorker(make_cfg())


def _opts(actor, **kw):
    base = dict(n=1, max_new_tokens=6, micro_batch_size=2, do_sample=True)
    return sampling_options(actor.rollout_cfg, **{**base, **kw})


def _drain(engine, steps=1):
    out = []
    while engine.stream_busy:
        rows = engine.poll(steps)
        if rows is not None:
            out.append(rows)
    return out


def _perturb(module, version, engine):
    """New weights land in the shared module, stamped with their version."""
    with torch.no_grad():
        gen = torch.Generator().manual_seed(version)
        for p in module.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.05)
    engine.finish_weight_update(version)


def test_greedy_streaming_gives_the_responses_of_generate(actor):
    batch = prompt_batch(actor.tokenizer, PROMPTS)
    engine = actor.engine
    expected = actor.generate(batch, n=1, do_sample=False, max_new_tokens=6)
    engine.submit(batch, _opts(actor, do_sample=False))
    rows = _drain(engine)
    got = {u: r for part in rows for u, r in zip(part["uid"], part["responses"].tolist())}
    assert got == dict(zip(expected["uid"], expected["responses"].tolist()))
    assert all((part["policy_version"] == engine.policy_version).all() for part in rows)


def test_slots_are_refilled_as_sequences_end(actor):
    batch = prompt_batch(actor.tokenizer, PROMPTS + ["3+3=", "8-2="])
    engine = actor.engine
    engine.submit(batch, _opts(actor, max_new_tokens=4))
    stream, steps, finished = engine._stream, 0, 0
    while stream.busy:
        waiting = len(stream.queue) + len(stream.active)
        stream.step(engine.policy_version, True)
        steps += 1
        done = len(stream.take_finished())
        finished += done
        assert len(stream.active) + done == min(2, waiting)  # every slot decoded one
    assert finished == 6
    # 6 requests of at most 4 tokens in 2 slots, refilled at once: at most 12 steps,
    # and fewer than 3 whole batches of 4 would take when responses end early
    assert steps <= 12


def test_rows_of_different_polls_keep_the_submitted_prompt_width(actor):
    """Prompts of different lengths finishing in different polls: every row is padded
    to the width its prompt row was submitted with, so the polls' rows (and the
    samples of one group) concatenate as the streaming buffer needs."""
    from hybridflow.core.batch import Batch
    batch = prompt_batch(actor.tokenizer, ["1+2=", "99-1=", "123+456="])
    width = batch["input_ids"].shape[1]
    assert len({int(m.sum()) for m in batch["attention_mask"]}) > 1  # lengths differ
    engine = actor.engine
    engine.submit(batch.repeat(2, interleave=True),
                  _opts(actor, do_sample=True, micro_batch_size=1, max_new_tokens=3))
    parts = _drain(engine)
    assert len(parts) > 1
    assert {p["prompts"].shape[1] for p in parts} == {width}
    rows = Batch.concat(parts)
    order = [list(rows["uid"]).index(u) for u in batch["uid"]]
    assert torch.equal(rows.take(order)["prompts"], batch["input_ids"])


def _mixed_run(actor, partial: bool):
    batch = prompt_batch(actor.tokenizer, PROMPTS)
    engine = actor.engine
    engine.finish_weight_update(0)
    engine.submit(batch, _opts(actor, max_new_tokens=6, partial=partial,
                               micro_batch_size=4))
    rows = [engine.poll(2)]  # two tokens of every request with version 0
    _perturb(actor.module, 1, engine)
    rows += _drain(engine)
    rows = [r for r in rows if r is not None]
    return torch.cat([r["token_versions"] for r in rows]), rows, engine


def test_partial_rollouts_keep_each_tokens_version(actor):
    versions, rows, engine = _mixed_run(actor, partial=True)
    real = versions != NO_TOKEN
    long = real.sum(-1) > 2
    assert long.any()
    for row, mask in zip(versions[long], real[long]):
        assert row[mask].tolist()[:2] == [0, 0] and set(row[mask].tolist()[2:]) == {1}
    pv = torch.cat([r["policy_version"] for r in rows])
    assert pv[long].eq(0).all()  # a row's version: its oldest token's
    assert engine.stream_counts()["mixed_rows"] == int(long.sum())


def test_partial_false_restarts_the_sequences_in_flight(actor):
    versions, rows, engine = _mixed_run(actor, partial=False)
    real = versions != NO_TOKEN
    for row, mask in zip(versions, real):
        assert len(set(row[mask].tolist())) == 1  # one version per response
    counts = engine.stream_counts()
    assert counts["mixed_rows"] == 0 and counts["restarts"] > 0
    assert counts["aborted_tokens"] == 2 * counts["restarts"]


def test_behaviour_log_probs_are_those_of_the_weights_that_sampled_each_token(actor):
    """Tokens sampled after the update have the new weights' log-probs; the first two
    (sampled before it) do not: they keep the old weights'."""
    versions, rows, _ = _mixed_run(actor, partial=True)
    batch = rows[-1]
    out = actor.module(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
    width = batch["responses"].shape[1]
    logits = out.logits[:, -width - 1:-1].float()
    now = torch.gather(torch.log_softmax(logits, -1), -1,
                       batch["responses"].unsqueeze(-1)).squeeze(-1)
    tv, mask = batch["token_versions"], batch["response_mask"].bool()
    new, old = mask & (tv == 1), mask & (tv == 0)
    assert new.any() and old.any()
    assert torch.allclose(batch["rollout_log_probs"][new], now[new].detach(), atol=1e-4)
    assert not torch.allclose(batch["rollout_log_probs"][old], now[old].detach(), atol=1e-4)


def test_a_seed_gives_the_same_stream(actor):
    def run():
        fresh = ActorWorker(make_cfg())
        fresh.engine.submit(prompt_batch(fresh.tokenizer, PROMPTS).repeat(2),
                            _opts(fresh))
        return [r["responses"].tolist() for r in _drain(fresh.engine, 3)]
    assert run() == run()


def test_abort_drops_what_is_not_finished(actor):
    engine = actor.engine
    engine.submit(prompt_batch(actor.tokenizer, PROMPTS), _opts(actor, max_new_tokens=6))
    engine.poll(1)
    assert engine.stream_busy and engine.abort() == 4 and not engine.stream_busy
    with pytest.raises(ValueError, match="one set of options"):
        engine.submit(prompt_batch(actor.tokenizer, PROMPTS), _opts(actor, top_k=3))


def _count_forwards(module):
    """Record the input width of every forward of `module` (a hook, not a timer)."""
    widths = []
    handle = module.register_forward_pre_hook(
        lambda _, args, kwargs: widths.append(kwargs["input_ids"].shape[1]), with_kwargs=True)
    return widths, handle


def test_a_decode_step_runs_one_token_per_sequence_whatever_the_prefix(actor):
    """The stream loop keeps a KV cache per sequence: after a request's prefill, each
    step's forward reads one new token per sequence, so a token's cost is flat in the
    prefix length (no O(length^2) recomputation of the prefix)."""
    batch = prompt_batch(actor.tokenizer, PROMPTS[:1])
    engine = actor.engine
    engine.submit(batch, _opts(actor, do_sample=False, max_new_tokens=12, micro_batch_size=1))
    widths, handle = _count_forwards(actor.module)
    try:
        rows = _drain(engine)
    finally:
        handle.remove()
    tokens = int(rows[0]["response_mask"].sum())
    assert tokens > 3 and len(widths) == tokens  # one forward per sampled token
    assert widths[0] == int(batch["attention_mask"].sum())  # the prefill: the prompt
    assert widths[1:] == [1] * (tokens - 1)


def test_a_weight_update_prefills_the_sequences_in_flight_with_the_new_weights(actor):
    """Partial rollouts: the caches the old weights computed are dropped at the update
    (one prefill of prompt + tokens so far), then decoding is one token again."""
    batch = prompt_batch(actor.tokenizer, PROMPTS[:1])
    engine = actor.engine
    engine.submit(batch, _opts(actor, do_sample=False, max_new_tokens=8, micro_batch_size=1))
    stream = engine._stream
    stream.step(engine.policy_version, True)
    stream.step(engine.policy_version, True)  # prefill, then one decode
    prompt_len = int(batch["attention_mask"].sum())
    widths, handle = _count_forwards(actor.module)
    try:
        _perturb(actor.module, engine.policy_version + 1, engine)
        stream.step(engine.policy_version, True)
        stream.step(engine.policy_version, True)
    finally:
        handle.remove()
    assert widths == [prompt_len + 2, 1]
