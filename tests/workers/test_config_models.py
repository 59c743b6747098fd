"""Config sections are typed and strict; models build from configs or local dirs only."""
import pytest
import torch
from omegaconf import OmegaConf

from hybridflow.workers.config import ActorConfig, LoraConfig, ModelConfig, read_section
from hybridflow.workers.models import build_causal_lm
from hybridflow.workers.tokenizer import build_char_tokenizer


def test_read_section_from_dictconfig_with_nested_lora():
    cfg = OmegaConf.create({"actor": {"lr": 0.5, "lora": {"rank": 4}}})
    actor = read_section(cfg, "actor", ActorConfig)
    assert actor.lr == 0.5 and isinstance(actor.lora, LoraConfig) and actor.lora.rank == 4
    assert read_section({}, "actor", ActorConfig) == ActorConfig()


def test_unknown_key_is_named():
    with pytest.raises(ValueError, match="unknown key.*'lrr'"):
        read_section({"actor": {"lrr": 1}}, "actor", ActorConfig)


def test_model_from_hub_id_is_refused_with_advice():
    with pytest.raises(FileNotFoundError, match="does not download"):
        build_causal_lm(ModelConfig(path="meta-llama/Llama-3-8B"), build_char_tokenizer(), "cpu")


def test_building_from_config_is_seeded():
    tok = build_char_tokenizer()
    a = build_causal_lm(ModelConfig(), tok, "cpu", seed=3)
    b = build_causal_lm(ModelConfig(), tok, "cpu", seed=3)
    assert all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters()))
    assert build_causal_lm(ModelConfig(dtype="bfloat16"), tok, "cpu").dtype == torch.bfloat16
