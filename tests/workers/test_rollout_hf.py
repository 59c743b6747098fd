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


def test_rollout_log_probs_equal_those_of_hf_output_scores():
    """The step-by-step log-probs (no `output_scores` kept) equal the ones read from
    HF's own scores, for the same sampled tokens (same seed, HF's own warpers)."""
    from transformers import GenerationConfig
    from hybridflow.workers.rollout.hf import sampled_log_probs
    actor = ActorWorker(make_cfg())
    batch = prompt_batch(actor.tokenizer, ["1+2=", "10+20=", "7*8="])
    options = dict(temperature=0.7, top_k=20, top_p=0.9, max_new_tokens=6)
    torch.manual_seed(3)
    out = actor.generate(batch, n=2, do_sample=True, **options)
    prompts = batch.repeat(2, interleave=True)
    torch.manual_seed(3)
    reference = actor.module.generate(
        input_ids=prompts["input_ids"], attention_mask=prompts["attention_mask"],
        position_ids=out["position_ids"][:, :prompts["input_ids"].shape[1]],
        generation_config=GenerationConfig(
            do_sample=True, temperature=0.7, top_k=20, top_p=0.9, max_new_tokens=6,
            min_new_tokens=0, pad_token_id=actor.tokenizer.pad_token_id,
            eos_token_id=actor.tokenizer.eos_token_id, return_dict_in_generate=True,
            output_scores=True))
    new = reference.sequences[:, prompts["input_ids"].shape[1]:]
    mask = out["response_mask"].bool()[:, :new.shape[1]]
    assert torch.equal(out["responses"][:, :new.shape[1]][mask], new[mask])
    expected = sampled_log_probs(reference.scores, new)
    assert torch.equal(out["rollout_log_probs"][:, :new.shape[1]][mask], expected[mask])
    assert (expected[mask] < 0).all() and mask.sum() > 6
