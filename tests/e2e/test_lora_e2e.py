"""End to end: GRPO with a LoRA actor learns the toy task (slow) while its workers hold
one base model plus adapters, and export merges the adapter (fast); without LoRA they
hold two full models plus Adam state."""
import os

import pytest
import torch
from transformers import AutoModelForCausalLM

from graphs.common import TOY_BASE
from hybridflow.commands.export import export_role
from hybridflow.workers.models import model_bytes
from tests.support.e2e import series, train

PeftModel = pytest.importorskip("peft").PeftModel

VAL = "val/toy_arith/greedy"
RANK = 8
LORA = (f"actor.lora.rank={RANK}", "actor.lr=2e-3")


def first(metrics, key):
    return series(metrics, key)[0]


def test_a_lora_actor_holds_one_base_model_and_exports_merged(tmp_path):
    base = AutoModelForCausalLM.from_pretrained(TOY_BASE)
    base_bytes = model_bytes(base)
    cfg = base.config
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    q, kv = cfg.num_attention_heads * head_dim, cfg.num_key_value_heads * head_dim
    # LoRA A [r, in] + B [out, r] on q (h->q), k and v (h->kv), o (q->h), fp32
    adapter_bytes = 4 * RANK * cfg.num_hidden_layers * (4 * cfg.hidden_size + 2 * q + 2 * kv)

    trainer, lora = train("grpo", tmp_path / "lora", *LORA, "trainer.steps=2",
                          "trainer.val_every=0")
    assert first(lora, "engine/weight_bytes") == base_bytes + adapter_bytes
    assert first(lora, "engine/optimizer_bytes") == pytest.approx(2 * adapter_bytes, rel=0.01)

    # `hybridflow export` merges the saved adapter into the run's base model
    ckpt = export_role(str(trainer.run.path), str(tmp_path / "merged"))
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged")
    adapted = PeftModel.from_pretrained(base, os.path.join(ckpt, "actor"))
    ids = torch.randint(0, cfg.vocab_size, (2, 12))
    assert torch.allclose(merged(ids).logits, adapted(ids).logits, atol=1e-5)
    assert not torch.allclose(merged(ids).logits, base(ids).logits)  # the adapter trained

    _, full = train("grpo", tmp_path / "full", "trainer.steps=1", "trainer.val_every=0")
    assert first(full, "engine/weight_bytes") == 2 * base_bytes  # actor + reference
    assert first(full, "engine/optimizer_bytes") == pytest.approx(2 * base_bytes, rel=0.01)


@pytest.mark.slow  # 20 training steps (~25 s)
def test_grpo_with_lora_learns(tmp_path):
    _, lora = train("grpo", tmp_path, *LORA, "trainer.steps=20", "trainer.val_every=20")
    accuracy = series(lora, VAL)
    assert accuracy[-1] >= accuracy[0] + 0.3, accuracy
