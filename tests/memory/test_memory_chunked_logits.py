"""`check --memory` sizes chunked log-probs (`actor.logprob_chunk`, `ref.logprob_chunk`) by
the chunk: the logits term of actor.update, actor.logprob and ref.logprob is the chunk's
positions times the vocabulary, the same however long the row, where whole logits grow
with it; a chunk at least the row's positions, 0, and the toy's vocabulary under the
default keep the whole-row term; under tp the chunk comes from the whole vocabulary."""
from __future__ import annotations

import pytest

from hybridflow.memory.passes import FP32, MicroBatch, logits_bytes
from hybridflow.memory.roles import _logit_chunk, actor_pass_memory
from hybridflow.workers.config import AUTO_LOGPROB_CHUNK_ELEMENTS, logprob_chunk_positions

VOCAB = 4096
HF = {"model_type": "qwen2", "hidden_size": 32, "intermediate_size": 64,
      "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 2,
      "vocab_size": VOCAB, "tie_word_embeddings": True, "max_position_embeddings": 8192}


def _cfg(response: int, chunk, vocab: int = VOCAB) -> dict:
    return {"model": {"hf_config": {**HF, "vocab_size": vocab}, "device": "cpu"},
            "actor": {"micro_batch_size": 1, "mini_batch_size": 1, "logprob_chunk": chunk},
            "ref": {"logprob_chunk": chunk},
            "rollout": {"max_new_tokens": response, "log_prob_micro_batch_size": 1, "n": 1},
            "data": {"max_prompt_length": 16, "batch_size": 1}}


@pytest.mark.parametrize("kind, copies", [("update", 4), ("logprob", 2)])
def test_the_logits_term_is_the_chunks_not_the_rows(kind, copies):
    whole = [actor_pass_memory(_cfg(r, 0), kind, rows=1)["logits"] for r in (512, 1024)]
    chunked = [actor_pass_memory(_cfg(r, 100), kind, rows=1)["logits"] for r in (512, 1024)]
    assert whole == [copies * FP32 * VOCAB * (r + 1) for r in (512, 1024)]
    assert chunked == [copies * FP32 * VOCAB * 100] * 2


def test_the_default_chunk_follows_the_vocabulary():
    auto = AUTO_LOGPROB_CHUNK_ELEMENTS // VOCAB  # 4096 positions
    logits = actor_pass_memory(_cfg(8000, None), "update", rows=1)["logits"]
    assert logits == 4 * FP32 * VOCAB * auto
    # the toy's 80 tokens: a chunk of 209,715 positions, more than any row here
    toy = actor_pass_memory(_cfg(8000, None, vocab=80), "update", rows=1)["logits"]
    assert toy == 4 * FP32 * 80 * 8001


def test_a_chunk_larger_than_the_rows_holds_the_rows():
    micro = MicroBatch(rows=2, prompt=8, response=10, logit_chunk=1000)
    assert micro.held_logit_positions == 2 * 11
    assert MicroBatch(2, 8, 10, logit_chunk=5).held_logit_positions == 5
    assert MicroBatch(2, 8, 10, full_logits=True, logit_chunk=None).held_logit_positions == 36


def test_a_tensor_parallel_rank_chunks_by_the_whole_vocabulary():
    from hybridflow.memory.model_size import model_size, tensor_parallel_slice
    from transformers import AutoConfig
    values = {k: v for k, v in HF.items() if k != "model_type"}
    size = model_size(AutoConfig.for_model("qwen2", **values), "causal")
    local = tensor_parallel_slice(size, 2)
    assert _logit_chunk(None, local, tp=2) == logprob_chunk_positions(None, VOCAB)
    micro = MicroBatch(1, 16, 8000, logit_chunk=_logit_chunk(None, local, tp=2))
    # the rank holds the chunk's positions of its half of the vocabulary
    assert logits_bytes(local, micro, train=True) == \
        4 * FP32 * (VOCAB // 2) * logprob_chunk_positions(None, VOCAB)
