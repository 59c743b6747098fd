"""Model sizes from names and from Hugging Face configs."""
import pytest

from hybridflow.planner import KNOWN_SIZES, ModelSpec

LLAMA2_7B_CONFIG = {
    "architectures": ["LlamaForCausalLM"], "hidden_size": 4096, "intermediate_size": 11008,
    "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 32,
    "vocab_size": 32000, "tie_word_embeddings": False, "model_type": "llama",
}


@pytest.mark.parametrize("name, billions",
                         [("7b", 6.74), ("13b", 13.0), ("34b", 33.7), ("70b", 69.0)])
def test_size_names_have_published_parameter_counts(name, billions):
    assert ModelSpec.from_name(name).params / 1e9 == pytest.approx(billions, rel=0.01)


def test_size_names_accept_common_spellings():
    assert ModelSpec.from_name("Llama-2-7B") == ModelSpec.from_name("7b")
    assert ModelSpec.from_name("70B") is KNOWN_SIZES["70b"]


def test_unknown_size_lists_the_known_ones():
    with pytest.raises(ValueError, match="known sizes: .*7b"):
        ModelSpec.from_name("9000b")


def test_hf_config_gives_the_same_shape_as_the_name():
    spec = ModelSpec.from_hf_config(LLAMA2_7B_CONFIG, name="llama2-7b")
    assert spec.params == ModelSpec.from_name("7b").params
    assert spec.kv_bytes_per_token == 2 * 32 * 4096 * 2


def test_hf_config_with_grouped_kv_and_tied_embeddings():
    qwen = {"hidden_size": 896, "intermediate_size": 4864, "num_attention_heads": 14,
            "num_hidden_layers": 24, "num_key_value_heads": 2, "vocab_size": 151936,
            "tie_word_embeddings": True}
    spec = ModelSpec.from_hf_config(qwen)
    assert spec.params / 1e9 == pytest.approx(0.494, rel=0.01)  # Qwen2.5-0.5B
    assert spec.kv_heads == 2


def test_hf_config_missing_fields_is_an_actionable_error():
    with pytest.raises(ValueError, match="lacks hidden_size"):
        ModelSpec.from_hf_config({"num_hidden_layers": 2})


QWEN3_32B_CONFIG = {
    "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 5120,
    "intermediate_size": 25600, "num_attention_heads": 64, "num_hidden_layers": 64,
    "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151936,
    "tie_word_embeddings": False,
}


def test_hf_config_head_dim_is_used_when_it_is_not_hidden_over_heads():
    """Qwen3-32B: head_dim 128 while hidden/heads is 80; it counts 32.8B parameters."""
    spec = ModelSpec.from_hf_config(QWEN3_32B_CONFIG)
    assert spec.head_dim == 128
    assert spec.params / 1e9 == pytest.approx(32.76, rel=0.005)
    assert spec.kv_bytes_per_token == 2 * 64 * 8 * 128 * 2  # K and V, bf16, every layer
    assert spec.params == ModelSpec.from_name("32b").params


def test_head_dim_equal_to_hidden_over_heads_changes_nothing():
    config = dict(LLAMA2_7B_CONFIG, head_dim=128)
    assert ModelSpec.from_hf_config(config).params == ModelSpec.from_name("7b").params


def test_tied_embeddings_count_the_vocabulary_once():
    untied = dict(LLAMA2_7B_CONFIG)
    tied = dict(LLAMA2_7B_CONFIG, tie_word_embeddings=True)
    difference = ModelSpec.from_hf_config(untied).params - ModelSpec.from_hf_config(tied).params
    assert difference == 32000 * 4096


def test_qwen2_attention_biases_are_counted():
    qwen = {"hidden_size": 896, "intermediate_size": 4864, "num_attention_heads": 14,
            "num_hidden_layers": 24, "num_key_value_heads": 2, "vocab_size": 151936,
            "tie_word_embeddings": True, "model_type": "qwen2"}
    with_bias = ModelSpec.from_hf_config(qwen).params
    without = ModelSpec.from_hf_config(dict(qwen, attention_bias=False)).params
    assert with_bias - without == 24 * (896 + 2 * 128)
