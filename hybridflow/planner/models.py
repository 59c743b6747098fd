"""Model sizes: parameter count and the shapes the cost model needs.

A size comes from a name ("7b", "llama-70b") looked up in a table of
published architectures, or from a Hugging Face `config.json` dict, so a user
can plan with the exact model they will train.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

BF16_BYTES = 2


@dataclass(frozen=True)
class ModelSpec:
    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int
    tied_embeddings: bool = False
    explicit_head_dim: int = 0  # a config's `head_dim` when it is not hidden / heads (Qwen3)
    qkv_bias: bool = False  # biases on q, k, v (Qwen2)
    qk_norm: bool = False  # RMSNorm on q and k per head (Qwen3)
    lora_rank: int = 0  # >0: the trained role trains LoRA adapters on q, k, v, o only

    @property
    def lora_params(self) -> int:
        """Adapter parameters at `lora_rank` on the attention projections (A: in x r,
        B: r x out)."""
        kv = self.kv_heads * self.head_dim
        return self.lora_rank * self.layers * (6 * self.hidden + 2 * kv)

    def __post_init__(self) -> None:
        if min(self.layers, self.hidden, self.heads, self.kv_heads, self.vocab) < 1:
            raise ValueError(f"model {self.name!r} has a non-positive dimension: {self}")
        if not self.explicit_head_dim and self.hidden % self.heads:
            raise ValueError(f"model {self.name!r}: hidden {self.hidden} not divisible by "
                             f"heads {self.heads}")

    @property
    def head_dim(self) -> int:
        return self.explicit_head_dim or self.hidden // self.heads

    @property
    def params(self) -> int:
        """Parameter count of a Llama-style decoder (gated MLP, RMSNorm)."""
        h, q, kv = self.hidden, self.heads * self.head_dim, self.kv_heads * self.head_dim
        attention = 2 * h * q + 2 * h * kv  # q, o and the (grouped) k, v
        attention += (q + 2 * kv) if self.qkv_bias else 0
        attention += 2 * self.head_dim if self.qk_norm else 0
        mlp = 3 * h * self.intermediate  # gate, up, down
        per_layer = attention + mlp + 2 * h  # two norms
        embeddings = self.vocab * h * (1 if self.tied_embeddings else 2)
        return self.layers * per_layer + embeddings + h

    @property
    def kv_bytes_per_token(self) -> int:
        """Bytes of bf16 K and V cache one token occupies over all layers."""
        return 2 * self.layers * self.kv_heads * self.head_dim * BF16_BYTES

    def describe(self) -> str:
        return (f"{self.name} ({self.params / 1e9:.1f}B params, {self.layers} layers, "
                f"hidden {self.hidden})")

    @classmethod
    def from_name(cls, name: str) -> ModelSpec:
        """A size name such as "7b", "13B" or "llama-70b"."""
        match = re.search(r"(\d+(?:\.\d+)?)\s*b\b", name.lower())
        key = f"{match.group(1)}b" if match else name.lower()
        if key not in KNOWN_SIZES:
            raise ValueError(f"unknown model size {name!r}; known sizes: {', '.join(KNOWN_SIZES)} "
                             "(or pass a Hugging Face config.json)")
        return KNOWN_SIZES[key]

    @classmethod
    def from_hf_config(cls, config: dict, name: str | None = None) -> ModelSpec:
        """Shapes from a Hugging Face causal-LM config dict (Llama, Qwen2, Mistral, ...;
        GPT-2's names too: core/model_config.py)."""
        from hybridflow.core.model_config import ALIASES, standard_shapes
        config = standard_shapes(config)
        required = ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size")
        missing = [k for k in required if config.get(k) is None]
        if missing:
            names = [f"{k} ({' or '.join(ALIASES[k])})" if k in ALIASES else k for k in missing]
            raise ValueError(f"model config lacks {', '.join(names)}; "
                             "is it a decoder-only causal LM config?")
        hidden = int(config["hidden_size"])
        heads = int(config["num_attention_heads"])
        head_dim = int(config.get("head_dim") or 0)
        model_type = str(config.get("model_type", ""))
        return cls(
            name=name or str(config.get("_name_or_path") or config.get("model_type") or "hf-model"),
            layers=int(config["num_hidden_layers"]),
            hidden=hidden,
            heads=heads,
            kv_heads=int(config.get("num_key_value_heads") or heads),
            intermediate=int(config.get("intermediate_size") or 4 * hidden),
            vocab=int(config["vocab_size"]),
            tied_embeddings=bool(config.get("tie_word_embeddings", False)),
            explicit_head_dim=head_dim if head_dim and head_dim * heads != hidden else 0,
            qkv_bias=bool(config.get("attention_bias", model_type == "qwen2")),
            qk_norm=model_type.startswith("qwen3"),
        )


# Published architectures: Llama-2 7B/13B/70B, CodeLlama-34B, Llama-3-8B and
# Qwen2.5 0.5B/1.5B/3B (the small ones people use for RL recipes), Qwen3-32B
# (head_dim 128 while hidden/heads is 80) and Llama-3.1-8B.
KNOWN_SIZES: dict[str, ModelSpec] = {
    "0.5b": ModelSpec("0.5b", 24, 896, 14, 2, 4864, 151936, tied_embeddings=True,
                      qkv_bias=True),
    "1.5b": ModelSpec("1.5b", 28, 1536, 12, 2, 8960, 151936, tied_embeddings=True,
                      qkv_bias=True),
    "3b": ModelSpec("3b", 36, 2048, 16, 2, 11008, 151936, tied_embeddings=True, qkv_bias=True),
    "7b": ModelSpec("7b", 32, 4096, 32, 32, 11008, 32000),
    "8b": ModelSpec("8b", 32, 4096, 32, 8, 14336, 128256),
    "13b": ModelSpec("13b", 40, 5120, 40, 40, 13824, 32000),
    "34b": ModelSpec("34b", 48, 8192, 64, 8, 22016, 32000),
    "70b": ModelSpec("70b", 80, 8192, 64, 8, 28672, 32000),
    "32b": ModelSpec("32b", 64, 5120, 64, 8, 25600, 151936, explicit_head_dim=128, qk_norm=True),
}
