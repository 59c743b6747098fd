"""Run configuration (hybridflow/program/config.py): structured defaults, then the graph's
defaults(), then a YAML file, then dotted overrides; every mistake is a ConfigError
naming the key."""
from __future__ import annotations

import pytest
from omegaconf.errors import ConfigAttributeError
from omegaconf import OmegaConf

from hybridflow.core.loading import UserFileError
from hybridflow.program.config import ConfigError, build_config, parse_overrides


def test_the_bare_defaults_are_a_valid_config():
    cfg = build_config()
    assert cfg.trainer.steps == 40 and cfg.runtime.name == "local"
    assert cfg.actor.mini_batch_size <= cfg.data.batch_size * cfg.rollout.n


def test_unknown_key_is_named_with_the_closest_suggestion():
    with pytest.raises(ConfigError, match=r"unknown config key 'trainer.step'; "
                                          r"did you mean 'trainer.steps'"):
        build_config(overrides=["trainer.step=3"])


def test_unknown_nested_key_suggests_the_nested_key():
    with pytest.raises(ConfigError, match=r"'actor.lora.rnk'.*'actor.lora.rank'"):
        build_config(overrides=["actor.lora.rnk=4"])


def test_unknown_top_level_section():
    with pytest.raises(ConfigError, match=r"unknown config key 'trainr.*did you mean 'trainer"):
        build_config(overrides=["trainr.steps=3"])


def test_wrong_type_names_the_key_and_the_value():
    with pytest.raises(ConfigError) as err:
        build_config(overrides=["trainer.steps=abc"])
    message = str(err.value)
    assert "bad value for 'trainer.steps'" in message and "'abc'" in message
    assert "\n" not in message  # omegaconf's internals (reference_type=...) are trimmed


@pytest.mark.parametrize("item", ["trainer.steps", "=3"])
def test_malformed_override(item):
    with pytest.raises(ConfigError, match=f"override '{item}' is not of the form key=value"):
        build_config(overrides=[item])
    with pytest.raises(ConfigError):
        parse_overrides([item])


def test_overrides_set_typed_values():
    cfg = build_config(overrides=["trainer.steps=7", "rollout.temperature=0.5",
                                  "trainer.progress=false", "workers.critic=my.mod:Critic",
                                  "algorithm.kl_coef=0.1", "actor.mini_batch_size=8"])
    assert cfg.trainer.steps == 7 and cfg.rollout.temperature == 0.5
    assert cfg.trainer.progress is False and cfg.workers.critic == "my.mod:Critic"
    assert cfg.algorithm.kl_coef == 0.1


def test_missing_yaml_file(tmp_path):
    path = tmp_path / "nope.yaml"
    with pytest.raises(UserFileError, match=f"config file '{path}' does not exist"):
        build_config(yaml_file=str(path))


def test_invalid_yaml(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("trainer: [\n")
    with pytest.raises(UserFileError, match="is not valid YAML"):
        build_config(yaml_file=str(path))


def test_yaml_that_is_not_a_mapping(tmp_path):
    path = tmp_path / "list.yaml"
    path.write_text("- trainer\n- data\n")
    with pytest.raises(ConfigError, match="must hold a mapping"):
        build_config(yaml_file=str(path))


def test_unknown_key_in_yaml_names_the_file(tmp_path):
    path = tmp_path / "typo.yaml"
    path.write_text("trainer:\n  stesp: 3\n")
    with pytest.raises(ConfigError, match=f"{path}: unknown config key 'trainer.stesp'"):
        build_config(yaml_file=str(path))


def test_mini_batch_larger_than_the_batch():
    with pytest.raises(ConfigError, match=r"actor.mini_batch_size=64 is larger than .* 32"):
        build_config(overrides=["data.batch_size=8", "rollout.n=4",
                                "actor.mini_batch_size=64"])
    build_config(overrides=["data.batch_size=8", "rollout.n=4", "actor.mini_batch_size=32"])


@pytest.mark.parametrize("override, words", [
    ("trainer.steps=0", "trainer.steps must be at least 1"),
    ("data.batch_size=0", "data.batch_size must be at least 1"),
    ("runtime.name=slurm", "runtime.name must be 'local' or 'ray'"),
])
def test_inconsistent_values(override, words):
    with pytest.raises(ConfigError, match=words):
        build_config(overrides=[override])


def test_graph_defaults_are_merged_and_checked():
    cfg = build_config({"rollout": {"n": 4}, "algorithm": {"gamma": 0.9}})
    assert cfg.rollout.n == 4 and cfg.algorithm.gamma == 0.9
    assert cfg.trainer.steps == 40  # untouched defaults stay
    with pytest.raises(ConfigError, match=r"graph defaults\(\): unknown config key 'rollout.m'"):
        build_config({"rollout": {"m": 4}})


def test_order_is_defaults_then_yaml_then_overrides(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("trainer:\n  steps: 5\n  seed: 9\nrollout:\n  n: 2\n")
    cfg = build_config({"trainer": {"steps": 3, "val_every": 2}, "rollout": {"n": 8}},
                       str(path), ["trainer.steps=11"])
    assert cfg.trainer.steps == 11       # override beats YAML
    assert cfg.trainer.seed == 9         # YAML beats the schema default
    assert cfg.rollout.n == 2            # YAML beats graph defaults
    assert cfg.trainer.val_every == 2    # graph defaults beat the schema default


def test_the_result_is_frozen_against_new_keys():
    cfg = build_config()
    with pytest.raises(ConfigAttributeError):
        cfg.trainer.stepz = 3
    assert OmegaConf.is_struct(cfg)


def test_unknown_pool_field_is_an_error():
    # pools and parallel layouts are typed (PoolConfig, ParallelConfig): refused while
    # the config is built, with the closest key
    with pytest.raises(ConfigError, match=r"'placement.pools.main.devics_per_node'; did "
                                          r"you mean 'placement.pools.main.devices_per_node'"):
        build_config(overrides=["placement.pools.main.devics_per_node=2"])
    with pytest.raises(ConfigError, match=r"'placement.parallel.actor.pt'"):
        build_config(overrides=["placement.parallel.actor.pt=2"])


def test_placement_gives_unplaced_roles_the_first_pool():
    from hybridflow.program.assemble import placement_from_config
    from hybridflow.graph.builder import Graph
    g = Graph("g")
    g.call("actor.generate", g.source())
    cfg = build_config(overrides=["placement.pools.main.devices_per_node=2",
                                  "placement.pools.rm.nodes=1", "placement.roles.reward=rm",
                                  "placement.parallel.actor.tp=2"])
    placement = placement_from_config(cfg, g)
    assert placement.roles == {"reward": "rm", "actor": "main"}
    assert placement.pools["main"].world_size == 2 and placement.tp_size("actor") == 2


def test_a_stop_timeout_past_a_week_is_refused_naming_the_key_and_the_most():
    """trainer.stop_timeout_s=1e12 was accepted and, on SIGTERM, the timer enforcing it
    died with OverflowError (issue 36): the bound is a week."""
    with pytest.raises(ConfigError, match=r"trainer.stop_timeout_s must be in \(0, 604800\]"):
        build_config(overrides=["trainer.stop_timeout_s=1e12"])
    assert build_config(overrides=["trainer.stop_timeout_s=604800"]).trainer.stop_timeout_s \
        == 604800
