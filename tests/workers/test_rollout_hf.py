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
