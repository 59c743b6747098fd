"""Run configuration: omegaconf structured defaults, then the graph's `defaults()`,
then a YAML file, then dotted `key=value` overrides, in that order.

The schema is typed: an unknown key or a value of the wrong type is an error naming
the key and suggesting the closest known one. Sections owned by the workers (model,
actor, rollout, critic, reward) are their dataclasses; `algorithm` is free-form, for
the graph's own knobs. The merged config is read here and in the workers' `__init__`
only, and passed down as values.
"""
from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from typing import Any, Optional

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigAttributeError, ConfigKeyError, ValidationError

from hybridflow.workers.config import (ActorConfig, CriticConfig, ModelConfig, RefConfig,
                                       RewardConfig, RolloutConfig)

__all__ = ["ConfigError", "RunConfig", "build_config", "parse_overrides"]


class ConfigError(ValueError):
    """A configuration mistake the user can fix; the message names the key."""


@dataclass
class TrainerConfig:
    steps: int = 40
    seed: int = 1
    val_every: int = 10          # 0 disables validation
    val_samples: int = 4         # N of mean@N / best@N
    save_every: int = 0          # 0 saves only at the end
    max_checkpoints: int = 2
    runs_dir: str = "runs"
    run_name: Optional[str] = None
    progress: bool = True
    tensorboard: bool = False
    wandb: bool = False
    check_finite: bool = True    # stop on NaN/inf in losses or rewards


@dataclass
class ToyTaskConfig:
    max_operand: int = 9
    test_fraction: float = 0.25
    train_on_test: bool = False  # also train on the held-out pairs (base-model SFT only)


@dataclass
class DataConfig:
    train_files: Optional[str] = None   # parquet/JSONL in verl's schema; None = toy task
    val_files: Optional[str] = None
    batch_size: int = 16                # prompts per step
    max_prompt_length: int = 16
    filter_overlong: bool = True
    shuffle: bool = True
    toy: ToyTaskConfig = field(default_factory=ToyTaskConfig)


@dataclass
class RuntimeConfig:
    name: str = "local"                 # local | ray
    address: Optional[str] = None       # join an existing Ray cluster
    num_cpus: Optional[int] = None      # for a Ray instance the run starts itself
    num_gpus: Optional[int] = None      # logical GPUs (CPU-only machines may declare them)
    call_timeout_s: float = 600.0       # a worker call slower than this is a failure
    start_timeout_s: float = 300.0      # actor start and model loading (Ray)
    torch_threads: int = 1


@dataclass
class ClusterConfig:
    """What `placement.auto` plans for."""
    nodes: int = 1
    devices_per_node: int = 1
    device: str = "cpu"          # a100-80g | h100-80g | h200-141g | cpu ...


@dataclass
class PlacementConfig:
    # pool name -> {nodes, devices_per_node}; roles -> pool; parallel: role -> {dp, tp}
    pools: dict[str, Any] = field(
        default_factory=lambda: {"main": {"nodes": 1, "devices_per_node": 1}})
    roles: dict[str, str] = field(default_factory=dict)  # unset roles go to the first pool
    parallel: dict[str, Any] = field(default_factory=dict)
    auto: bool = False           # run the planner and use its best placement
    cluster: ClusterConfig = field(default_factory=ClusterConfig)


@dataclass
class RunConfig:
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    data: DataConfig = field(default_factory=DataConfig)
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)
    placement: PlacementConfig = field(default_factory=PlacementConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    # rows per optimizer step: the default batch (data.batch_size x rollout.n) is 16 rows
    actor: ActorConfig = field(default_factory=lambda: ActorConfig(mini_batch_size=16))
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    critic: CriticConfig = field(default_factory=CriticConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    ref: RefConfig = field(default_factory=RefConfig)
    workers: dict[str, str] = field(default_factory=dict)  # role -> "module:Class"
    algorithm: dict[str, Any] = field(default_factory=dict)


def _known_keys(cfg: DictConfig, prefix: str = "") -> list[str]:
    keys = []
    for key in cfg.keys():
        path = f"{prefix}{key}"
        keys.append(path)
        value = cfg._get_node(key)
        if isinstance(value, DictConfig) and not value._is_missing() and not value._is_none():
            keys += _known_keys(value, path + ".")
    return keys


def _explain(err: Exception, cfg: DictConfig, source: str) -> ConfigError:
    key = getattr(err, "full_key", None) or str(err)
    if isinstance(err, ValidationError):
        detail = str(getattr(err, "msg", err)).splitlines()[0]  # omegaconf appends its internals
        return ConfigError(f"{source}: bad value for '{key}': {detail}")
    close = difflib.get_close_matches(str(key), _known_keys(cfg), n=3, cutoff=0.6)
    hint = f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
    return ConfigError(f"{source}: unknown config key '{key}'{hint}")


def parse_overrides(items: list[str]) -> list[str]:
    for item in items:
        if "=" not in item or item.startswith("="):
            raise ConfigError(f"override {item!r} is not of the form key=value "
                              f"(e.g. trainer.steps=100)")
    return list(items)


def _merge(base: DictConfig, other, source: str) -> DictConfig:
    try:
        return OmegaConf.merge(base, other)
    except (ConfigKeyError, ConfigAttributeError, ValidationError) as err:
        raise _explain(err, base, source) from None


def build_config(graph_defaults: dict | None = None, yaml_file: str | None = None,
                 overrides: list[str] | None = None) -> DictConfig:
    """The merged, validated run config (struct mode: no new keys after this)."""
    cfg = OmegaConf.structured(RunConfig)
    if graph_defaults:
        cfg = _merge(cfg, OmegaConf.create(graph_defaults), "graph defaults()")
    if yaml_file:
        try:
            loaded = OmegaConf.load(yaml_file)
        except FileNotFoundError:
            raise ConfigError(f"config file {yaml_file!r} does not exist") from None
        except Exception as err:  # noqa: BLE001 - yaml errors come in many types
            raise ConfigError(f"config file {yaml_file!r} is not valid YAML: {err}") from None
        if not isinstance(loaded, DictConfig):
            raise ConfigError(f"config file {yaml_file!r} must hold a mapping of sections "
                              f"(trainer:, data:, ...), not a {type(loaded).__name__}")
        cfg = _merge(cfg, loaded, yaml_file)
    if overrides:
        cfg = _merge(cfg, OmegaConf.from_dotlist(parse_overrides(overrides)), "override")
    _check_consistency(cfg)
    OmegaConf.set_struct(cfg, True)
    return cfg


def _check_consistency(cfg: DictConfig) -> None:
    if cfg.trainer.steps < 1:
        raise ConfigError(f"trainer.steps must be at least 1, got {cfg.trainer.steps}")
    if cfg.data.batch_size < 1:
        raise ConfigError(f"data.batch_size must be at least 1, got {cfg.data.batch_size}")
    if cfg.runtime.name not in ("local", "ray"):
        raise ConfigError(f"runtime.name must be 'local' or 'ray', not {cfg.runtime.name!r}")
    for key in ("rollout.n", "data.max_prompt_length", "rollout.max_new_tokens"):
        if OmegaConf.select(cfg, key) < 1:
            raise ConfigError(f"{key} must be at least 1, got {OmegaConf.select(cfg, key)}")
    rows = cfg.data.batch_size * cfg.rollout.n
    mini = cfg.actor.mini_batch_size
    if mini and mini > rows:
        raise ConfigError(f"actor.mini_batch_size={mini} is larger than the batch of "
                          f"data.batch_size * rollout.n = {rows} responses")
    for section in ("actor", "critic"):
        _check_optimizer(section, cfg[section])
    _check_names(cfg)


def _check_optimizer(name: str, section: DictConfig) -> None:
    if section.lr < 0:
        raise ConfigError(f"{name}.lr must not be negative, got {section.lr}")
    for key in ("mini_batch_size", "micro_batch_size", "ppo_epochs"):
        if section[key] < 1:
            raise ConfigError(f"{name}.{key} must be at least 1, got {section[key]}")
    # a micro-batch larger than the mini-batch is fine: the mini-batch is one micro-batch


def _one_of(key: str, value: str, valid, what: str) -> None:
    if value not in valid:
        close = difflib.get_close_matches(str(value), list(valid), n=1, cutoff=0.5)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise ConfigError(f"{key}={value!r} is not a known {what}{hint} "
                          f"(valid: {', '.join(valid)})")


def _check_names(cfg: DictConfig) -> None:
    """Names the workers look up in the algorithms' registries, checked before any
    worker starts instead of at the first update."""
    from algorithms.kl import KL_KINDS
    from algorithms.losses import AGG_MODES, POLICY_LOSSES
    from hybridflow.workers.models import resolve_dtype
    _one_of("actor.policy_loss", cfg.actor.policy_loss, sorted(POLICY_LOSSES), "policy loss")
    _one_of("actor.kl_loss_type", cfg.actor.kl_loss_type, KL_KINDS, "KL kind")
    for section in ("actor", "critic"):
        _one_of(f"{section}.loss_agg_mode", cfg[section].loss_agg_mode, AGG_MODES,
                "loss aggregation mode")
        _one_of(f"{section}.strategy", cfg[section].strategy, ("ddp", "fsdp2"),
                "training strategy")
        _one_of(f"{section}.lr_schedule", cfg[section].lr_schedule, ("constant", "cosine"),
                "lr schedule")
    from hybridflow.workers.rollout.engine import check_engine_name
    try:
        check_engine_name(cfg.rollout.backend)
    except ValueError as err:
        raise ConfigError(str(err)) from None
    try:
        resolve_dtype(cfg.model.dtype)
    except ValueError as err:
        raise ConfigError(f"model.dtype: {err}") from None
