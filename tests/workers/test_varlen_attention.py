"""`sdpa_varlen`: packed rows attend each to its own tokens, one causal sdpa per
sequence, and it is transformers' sdpa whenever a call is not packed."""
import pytest
import torch

from tests.support.workers import TINY, make_cfg, ragged_responses, rollout_for_update
from hybridflow.workers import ActorWorker

QWEN2 = {**TINY, "model_type": "qwen2", "rope_theta": 10000.0}
MODELS = {"llama": TINY, "qwen2": QWEN2}


def cfg_for(model_type: str, packed: bool, **sections) -> dict:
    cfg = make_cfg(**sections)
    cfg["model"] = {**cfg["model"], "hf_config": dict(MODELS[model_type]),
                    "use_remove_padding": packed}
    return cfg


@pytest.fixture(scope="module")
def rollout():
    actor = ActorWorker(make_cfg())
    batch = rollout_for_update(actor, n=2)
    return ragged_responses(batch, [6, 1, 2, 6, 3, 1, 5, 2], actor.tokenizer.pad_token_id)


def test_sdpa_models_attend_per_sequence_and_match_the_dense_block_mask(rollout):
    from transformers import AttentionInterface

    from hybridflow.workers import varlen_attention
    actor = ActorWorker(cfg_for("qwen2", True))
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
        actor = ActorWorker(cfg_for("llama", packed, rollout={"do_sample": False}))
        outs.append(actor.generate(prompt_batch(actor.tokenizer, PROMPTS), n=1)["responses"])
    assert torch.equal(outs[0], outs[1])


def test_only_sdpa_models_switch_and_eager_keeps_its_mask():
    from hybridflow.workers.varlen_attention import VARLEN, use_varlen_attention
    cfg = cfg_for("llama", True)
    cfg["model"]["hf_config"]["attn_implementation"] = "eager"
    actor = ActorWorker(cfg)
    assert actor.module.config._attn_implementation == "eager"
    assert not use_varlen_attention(actor.module)
    assert ActorWorker(cfg_for("llama", False)).module.config._attn_implementation == "sdpa"
    assert ActorWorker(cfg_for("llama", True)).module.config._attn_implementation == VARLEN
