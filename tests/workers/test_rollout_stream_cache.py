"""The stream loop's batched KV cache (workers/rollout/stream_cache.py) and sampler:
rows joining and leaving the cache at different steps get the tokens and log-probs each
gets decoded alone, the cache is no wider than its longest sequence, and the stream
draws as the engine's batched loop (hf_decode.py) does for the same seed."""
from types import SimpleNamespace

import pytest
import torch

from hybridflow.workers import ActorWorker
from hybridflow.workers.rollout.generation import sampling_options
from hybridflow.workers.rollout.hf_decode import decode
from hybridflow.workers.rollout.stream import StreamLoop
from tests.support.workers import make_cfg, prompt_batch

PROMPTS = ["1+2=", "10+20=", "7*8=", "99-1=", "5+5=", "123+4=", "40-2=", "3+4="]
LONG_FIRST = ["123456+789=", "7*8=", "99-1=", "10+20=", "5+5=", "123+4=", "40-2=", "2*3*4*5="]


@pytest.fixture(scope="module")
def actor():
    actor = ActorWorker(make_cfg())
    actor.module.eval()
    return actor


def _loop(actor, eos, seed=0, **kw):
    opts = sampling_options(actor.rollout_cfg, **{**dict(n=1, max_new_tokens=8,
                                                         micro_batch_size=3), **kw})
    tok = SimpleNamespace(pad_token_id=actor.tokenizer.pad_token_id, eos_token_id=eos)
    return StreamLoop(actor.module, tok, "cpu", opts, seed)


def _third_token_of_the_first(actor, batch) -> int:
    """As the EOS: the first (longest) prompt's third greedy token, so that row leaves
    the cache early, beside rows that go on."""
    tokens, _ = decode(actor.module, batch["input_ids"][:1], batch["attention_mask"][:1], 3,
                       [], actor.tokenizer.pad_token_id, [], greedy=True)
    return int(tokens[0, 2])


def _alone(loop, actor, prompt_ids) -> tuple[list[int], list[float]]:
    ids = torch.tensor([prompt_ids])
    tokens, logps = decode(actor.module, ids, torch.ones_like(ids), loop.opts.max_new_tokens,
                           sorted(loop.eos), loop.pad, [], greedy=True)
    return tokens[0].tolist(), logps[0].tolist()  # one row: it stops at its own end


def test_rows_joining_and_leaving_get_what_each_gets_decoded_alone(actor):
    """8 requests of different widths in 3 slots, ending at different steps: the rows
    that join the cache mid-stream, beside rows of other widths, and the rows that stay
    after others left (the longest among them), decode as each does alone; after every
    step the cache is as wide as its longest sequence (columns of padding only are
    dropped, so its width does not grow with the stream)."""
    batch = prompt_batch(actor.tokenizer, LONG_FIRST)
    loop = _loop(actor, _third_token_of_the_first(actor, batch), do_sample=False)
    loop.submit(batch)
    done, joined_beside, narrowed, width = [], 0, 0, 0
    while loop.busy:
        joined_beside += bool(loop.queue and loop.active and len(loop.active) < loop.slots)
        loop.step(0, True)
        done += loop.take_finished()
        narrowed += bool(loop.active) and loop.cache.mask.shape[1] <= width
        width = loop.cache.mask.shape[1] if loop.active else 0
        if loop.active:
            longest = max(len(r.prompt) + len(r.tokens) - 1 for r in loop.active)
            assert loop.cache.rows == len(loop.active)
            assert loop.cache.mask.shape[1] == longest
            assert loop.cache.lengths.tolist() == [len(r.prompt) + len(r.tokens) - 1
                                                   for r in loop.active]
    lengths = {len(r.tokens) for r in done}
    assert len(done) == len(PROMPTS) and len(lengths) > 1  # rows ended at different steps
    assert joined_beside > 0 and narrowed > 0  # rows joined beside others; it narrowed
    for req in done:
        tokens, logps = _alone(loop, actor, req.prompt)
        assert req.tokens == tokens
        assert torch.allclose(torch.tensor(req.logps), torch.tensor(logps), atol=1e-5)


def test_the_stream_draws_as_the_batched_loop_for_the_same_seed(actor):
    """All requests in slots at once and none ending early: the stream's generator and
    the batched loop's global RNG, seeded alike, draw the same tokens with the same
    log-probs (one uniform a row, inverted through the CDF: hf_decode's `sample`)."""
    batch = prompt_batch(actor.tokenizer, PROMPTS)
    loop = _loop(actor, -1, seed=7, do_sample=True, micro_batch_size=len(PROMPTS),
                 max_new_tokens=6)
    loop.submit(batch)
    while loop.busy:
        loop.step(0, True)
    got = sorted(loop.take_finished(), key=lambda r: r.rid)
    torch.manual_seed(7)
    tokens, logps = decode(actor.module, batch["input_ids"], batch["attention_mask"], 6, [-1],
                           loop.pad, [], greedy=False)
    assert [r.tokens for r in got] == tokens.tolist()
    assert torch.allclose(torch.tensor([r.logps for r in got]), logps, atol=1e-5)


def test_hf_loop_generate_keeps_the_draws_of_the_multinomial_sampler(actor):
    """rollout.hf_loop=generate (the old draws for a seed, for one release): the stream
    samples with torch.multinomial from its generator, not the CDF inversion."""
    batch = prompt_batch(actor.tokenizer, PROMPTS[:4])

    def run(hf_loop):
        loop = _loop(actor, -1, seed=3, do_sample=True, micro_batch_size=4,
                     max_new_tokens=6, hf_loop=hf_loop)
        loop.submit(batch)
        calls = []
        original = torch.multinomial
        try:
            torch.multinomial = lambda *a, **k: calls.append(1) or original(*a, **k)
            while loop.busy:
                loop.step(0, True)
        finally:
            torch.multinomial = original
        return len(calls)
    assert run("generate") == 6 and run("own") == 0
