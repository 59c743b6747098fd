"""The shapes of a Hugging Face model config read under one set of names, whatever the
model family calls them: GPT-2 says `n_embd`, `n_layer`, `n_head`, `n_inner`,
`n_positions` where Llama says `hidden_size`, `num_hidden_layers`,
`num_attention_heads`, `intermediate_size`, `max_position_embeddings` (transformers
maps them with each config class's `attribute_map`; a config read as a JSON dict has
no class, so the aliases are listed here). Every pre-launch reader of a config dict
(the planner's model shapes, the tensor-parallel head check, vLLM's checks) reads it
through `standard_shapes`, so a model `run` can build is one `check` can read.
Stateless.
"""
from __future__ import annotations

__all__ = ["ALIASES", "standard_shapes"]

# standard name -> the other names transformers' config classes use for it
ALIASES: dict[str, tuple[str, ...]] = {
    "hidden_size": ("n_embd", "d_model", "hidden_dim"),
    "num_hidden_layers": ("n_layer", "num_layers", "n_layers"),
    "num_attention_heads": ("n_head", "num_heads", "n_heads"),
    "num_key_value_heads": ("num_kv_heads", "n_head_kv", "multi_query_group_num"),
    "intermediate_size": ("n_inner", "ffn_dim", "d_ff"),
    "max_position_embeddings": ("n_positions", "max_sequence_length", "seq_length"),
}


def standard_shapes(config: dict) -> dict:
    """`config` (a multimodal one's `text_config`) with every standard name of ALIASES
    set from its alias where the config lacks it (a None value counts as absent)."""
    text = config.get("text_config")
    out = dict(text) if isinstance(text, dict) else dict(config)
    for name, aliases in ALIASES.items():
        if out.get(name) is not None:
            continue
        found = next((out[a] for a in aliases if out.get(a) is not None), None)
        if found is not None:
            out[name] = found
    return out
