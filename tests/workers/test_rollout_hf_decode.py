"""The `hf` engine's decode loop (workers/rollout/hf_decode.py): its sampler draws from
the given distribution, greedy decoding gives HF `generate`'s tokens, and dropping
ended rows from the batch changes no other row."""
import torch
from transformers import GenerationConfig

from tests.support.workers import make_cfg, prompt_batch
from hybridflow.workers import ActorWorker
from hybridflow.workers.rollout.hf_decode import decode, sample


def test_sample_draws_each_token_at_its_probability_and_never_a_masked_one():
    probs = torch.tensor([0.5, 0.0, 0.3, 0.15, 0.05, 0.0])
    logp = probs.log().expand(20_000, -1).contiguous()      # 0 -> -inf: never drawn
    torch.manual_seed(0)
    drawn = sample(logp)
    freq = torch.bincount(drawn, minlength=6).double() / len(drawn)
    sigma = (probs.double() * (1 - probs.double()) / len(drawn)).sqrt()
    assert (freq - probs.double()).abs().le(5 * sigma + 1e-12).all(), freq
    assert freq[1] == 0 and freq[5] == 0
    torch.manual_seed(0)
    assert torch.equal(sample(logp), drawn)                   # the seed fixes the draws


def test_sample_at_the_top_of_the_cdf_takes_the_last_possible_token(monkeypatch):
    """A uniform that rounds up to the CDF's total lands on the last token of non-zero
    probability, not on a masked one after it."""
    logp = torch.tensor([[0.6, 0.4, 0.0, 0.0]]).log()
    monkeypatch.setattr(torch, "rand", lambda *a, **k: torch.ones(1, 1, dtype=k["dtype"]))
    assert sample(logp).tolist() == [1]


def test_greedy_tokens_equal_those_of_hf_generate():
    actor = ActorWorker(make_cfg())
    batch = prompt_batch(actor.tokenizer, ["1+2=", "10+20=", "7*8=", "99-1="])
    out = actor.generate(batch, n=1, do_sample=False, max_new_tokens=8)
    tok = actor.tokenizer
    with torch.no_grad():
        ref = actor.module.generate(
            input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
            generation_config=GenerationConfig(do_sample=False, max_new_tokens=8,
                                               pad_token_id=tok.pad_token_id,
                                               eos_token_id=tok.eos_token_id))
    new = ref[:, batch["input_ids"].shape[1]:]
    mask = out["response_mask"].bool()[:, :new.shape[1]]
    assert torch.equal(out["responses"][:, :new.shape[1]][mask], new[mask])


def test_rows_dropped_when_they_end_leave_the_others_unchanged():
    """Rows ending at different steps (the EOS made a frequent greedy token) are cut
    out of the batch and its cache; every row still gets the tokens and log-probs it
    gets decoded alone, pad and 0 after its EOS."""
    actor = ActorWorker(make_cfg())
    tok, module = actor.tokenizer, actor.module.eval()
    batch = prompt_batch(tok, ["1+2=", "10+20=", "7*8=", "99-1=", "5+5=", "123+4="])
    ids, mask = batch["input_ids"], batch["attention_mask"]
    free, _ = decode(module, ids, mask, 8, [], tok.pad_token_id, [], greedy=True)
    eos = int(free[:, 1:].flatten().mode().values)            # ends some rows early
    tokens, logps = decode(module, ids, mask, 8, [eos], tok.pad_token_id, [], greedy=True)
    ends = [(row == eos).nonzero()[0, 0].item() + 1 if (row == eos).any() else 8
            for row in tokens]
    assert len(set(ends)) > 1 and min(ends) < tokens.shape[1]  # ended at different steps
    for i, end in enumerate(ends):
        real = mask[i].bool()
        alone, alone_logp = decode(module, ids[i:i + 1, real], mask[i:i + 1, real], 8, [eos],
                                   tok.pad_token_id, [], greedy=True)
        assert torch.equal(tokens[i, :end], alone[0, :end])
        assert torch.allclose(logps[i, :end], alone_logp[0, :end], atol=1e-5)
        assert (tokens[i, end:] == tok.pad_token_id).all() and (logps[i, end:] == 0).all()
