"""The HF engine stops decoding once every row has ended (HF `generate` checks the
stopping criteria each step): no forward is spent on a batch whose rows all ended."""
import torch

from tests.support.workers import make_cfg, prompt_batch
from hybridflow.workers import ActorWorker


def decode_forwards(actor, batch, max_new_tokens: int):
    """(rollout, forward calls of the model) for a greedy generate."""
    calls = []
    handle = actor.module.register_forward_hook(lambda *args: calls.append(1))
    try:
        out = actor.generate(batch, n=2, do_sample=False, max_new_tokens=max_new_tokens)
    finally:
        handle.remove()
    return out, len(calls)


def test_generation_stops_when_every_row_has_ended():
    actor = ActorWorker(make_cfg())
    batch = prompt_batch(actor.tokenizer, ["1+2="])
    before, full = decode_forwards(actor, batch, 6)
    assert full == int(before["response_length"].max()) > 1  # one forward per token
    eos_id = int(before["responses"][0, 0])  # greedy's first token becomes the EOS
    actor.tokenizer.eos_token = actor.tokenizer.convert_ids_to_tokens(eos_id)
    after, early = decode_forwards(actor, batch, 6)
    stop = 1
    assert after["response_length"].tolist() == [stop, stop]
    assert early == stop < full  # no forward after every row ended
    assert after["responses"].shape[1] == 6  # the layout still pads to max_new_tokens
    assert torch.equal(after["rollout_log_probs"][:, stop:], torch.zeros(2, 6 - stop))


def test_rollout_log_probs_are_those_of_the_processed_distribution():
    """Each sampled token's rollout log-prob is its log-prob under the distribution it
    was drawn from: the teacher-forced logits with HF's own warpers applied
    (temperature, top-k, top-p), as `sampled_log_probs` reads them from scores."""
    from hybridflow.workers.config import RolloutConfig
    from hybridflow.workers.rollout.hf import sampled_log_probs, sampled_warpers
    from hybridflow.workers.sequences import response_logits
    actor = ActorWorker(make_cfg())
    batch = prompt_batch(actor.tokenizer, ["1+2=", "10+20=", "7*8="])
    options = dict(temperature=0.7, top_k=20, top_p=0.9, max_new_tokens=6)
    torch.manual_seed(3)
    out = actor.generate(batch, n=2, do_sample=True, **options)
    warpers = sampled_warpers(RolloutConfig(do_sample=True, **options))
    with torch.no_grad():
        logits = response_logits(actor.module, out)          # [B, R, V], before warping
    scores = []
    for step in range(logits.shape[1]):
        step_scores = logits[:, step]
        for warp in warpers:
            step_scores = warp(out["responses"][:, :step], step_scores)
        scores.append(step_scores)
    expected = sampled_log_probs(tuple(scores), out["responses"])
    mask = out["response_mask"].bool()
    assert mask.sum() > 6
    assert torch.allclose(out["rollout_log_probs"][mask], expected[mask], atol=1e-5)
    assert (expected[mask] < 0).all() and torch.isfinite(expected[mask]).all()
    assert (out["rollout_log_probs"][~mask] == 0).all()
