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


# ---- names checked against registries others fill (not lists in the engine)
def test_a_registered_training_backend_is_an_accepted_strategy(monkeypatch):
    from hybridflow.program.config import ConfigError, build_config
    from hybridflow.workers import backends
    with pytest.raises(ConfigError, match=r"actor.strategy='megatron' is not a known training "
                                          r"strategy.*register_backend"):
        build_config(overrides=["actor.strategy=megatron"])
    monkeypatch.setitem(backends.BACKENDS, "megatron", backends.DDPBackend)
    cfg = build_config(overrides=["actor.strategy=megatron", "critic.strategy=megatron"])
    assert cfg.actor.strategy == cfg.critic.strategy == "megatron"


def test_loss_setting_names_are_the_ones_the_loss_providers_register(monkeypatch):
    import sys

    import hybridflow.graphs as graphs
    import hybridflow.graphs.ops as shipped_ops
    from hybridflow.graph import loss
    from hybridflow.program.config import ConfigError, build_config
    from hybridflow.workers import config
    # as in a fresh process: nothing registered, the provider hybridflow.graphs.ops not
    # imported (under either of its names)
    monkeypatch.setattr(config, "LOSS_SETTING_NAMES", {})
    monkeypatch.setattr(loss, "DEFAULT_LOSSES", {})
    monkeypatch.setattr(graphs, "ops", shipped_ops)  # restored after the re-import
    monkeypatch.delitem(sys.modules, "hybridflow.graphs.ops")
    monkeypatch.delitem(sys.modules, "graphs.ops", raising=False)
    with pytest.raises(ConfigError, match=r"actor.policy_loss='ppo2' is not a known policy "
                                          r"loss; did you mean 'ppo'"):
        build_config(overrides=["actor.policy_loss=ppo2"])  # the provider imported by name
    config.register_setting_names("policy loss", ["ppo", "my_loss"])
    assert build_config(overrides=["actor.policy_loss=my_loss"]).actor.policy_loss == "my_loss"
    monkeypatch.setattr(config, "LOSS_SETTING_NAMES", {})
    monkeypatch.setattr(loss, "DEFAULT_LOSS_PROVIDERS", [])  # no default loss reads the names
    assert build_config(overrides=["actor.kl_loss_type=anything"]).actor.kl_loss_type == \
        "anything"


@pytest.mark.parametrize("override, words", [
    ("reward.scorer_table=algorithms.rewards:NOPE",
     "reward.scorer_table='algorithms.rewards:NOPE': 'algorithms.rewards' defines no 'NOPE'"),
    ("reward.scorer_table=SCORERS", "reward.scorer_table='SCORERS' must name an object as "
                                    "'package.module:NAME'"),
    ("data.toy.maker=no_such_pkg:make", "data.toy.maker='no_such_pkg:make': cannot import "
                                        "module 'no_such_pkg'"),
])
def test_objects_named_by_import_path_are_checked_before_launch(override, words):
    from hybridflow.program.config import ConfigError, build_config
    with pytest.raises(ConfigError) as err:
        build_config(overrides=[override])
    assert words in str(err.value)
