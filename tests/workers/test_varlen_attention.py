"""`sdpa_varlen`: packed rows attend each to its own tokens, one causal sdpa per
sequence, and it is transformers' sdpa whenever a call is not packed."""
import pytest
import torch

from tests.support.workers import packed_cfg, ragged_rollout
from hybridflow.workers import ActorWorker


@pytest.fixture(scope="module")
def rollout():
    return ragged_rollout([6, 1, 2, 6, 3, 1, 5, 2])


def test_sdpa_models_attend_per_sequence_and_match_the_dense_block_mask(rollout):
    from transformers import AttentionInterface

    from hybridflow.workers import varlen_attention
    actor = ActorWorker(packed_cfg("qwen2", True))
    assert actor.module.config._attn_implementation == varlen_attention.VARLEN
    offsets = []

    def spy(*args, **kwargs):
        offsets.append(kwargs.get("cu_seq_lens_q"))
        return varlen_attention.varlen_sdpa(*args, **kwargs)
    AttentionInterface.register(varlen_attention.VARLEN, spy)
    try:
        varlen = actor.logprob(rollout, micro_batch_size=8)["old_log_probs"]
    finally:
        varlen_attention.register_varlen_attention()
    lengths = rollout["attention_mask"].sum(dim=1)
    assert offsets and offsets[0].tolist() == [0] + lengths.cumsum(0).tolist()
    actor.module.set_attn_implementation("sdpa")  # dense [T, T] block-diagonal mask
    dense = actor.logprob(rollout, micro_batch_size=8)["old_log_probs"]
    torch.testing.assert_close(varlen, dense, rtol=0, atol=1e-5)


def test_generation_is_unchanged_by_the_varlen_attention():
    from tests.support.workers import PROMPTS, prompt_batch
    outs = []
    for packed in (False, True):
        actor = ActorWorker(packed_cfg("llama", packed, rollout={"do_sample": False}))
        outs.append(actor.generate(prompt_batch(actor.tokenizer, PROMPTS), n=1)["responses"])
    assert torch.equal(outs[0], outs[1])


def test_only_sdpa_models_switch_and_eager_keeps_its_mask():
    from hybridflow.workers.varlen_attention import VARLEN, use_varlen_attention
    cfg = packed_cfg("llama", True)
    cfg["model"]["hf_config"]["attn_implementation"] = "eager"
    actor = ActorWorker(cfg)
    assert actor.module.config._attn_implementation == "eager"
    assert not use_varlen_attention(actor.module)
    assert ActorWorker(packed_cfg("llama", False)).module.config._attn_implementation == "sdpa"
    assert ActorWorker(packed_cfg("llama", True)).module.config._attn_implementation == VARLEN
