"""Run configuration: omegaconf structured defaults, then the graph's `defaults()`,
then a YAML file, then dotted `key=value` overrides, in that order.

The schema is typed: an unknown key or a value of the wrong type is an error naming
the key and suggesting the closest known one, and every field's range is checked
(`hybridflow/core/constraints.py`) before anything starts. Sections owned by the workers
(model, actor, rollout, critic, reward, ref) are their dataclasses; `algorithm` is
the graph's: typed by the dataclass a graph file declares as `ALGORITHM`, free-form
when it declares none. A role bound in `workers` beyond the built-in ones gets a
section of its own name: typed by its worker class's `config_schema` dataclass, or
free-form. The merged config is built once (`build_config`), converted to typed
values once (`run_values`) and passed down.
"""
from __future__ import annotations

import dataclasses
import difflib
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from omegaconf import DictConfig, OmegaConf, open_dict
from omegaconf.errors import (ConfigAttributeError, ConfigKeyError,
                              InterpolationResolutionError, ValidationError)

from hybridflow.core.constraints import (ConfigError, Rule, at_least, check_values,
                                         checked, in_range, one_of, plain_name)
from hybridflow.core.data import DEFAULT_TOY_MAKER
from hybridflow.core.modes import AsyncMode, StreamSide
from hybridflow.core.names import named_object
from hybridflow.core.runtime_section import RuntimeConfig
from hybridflow.workers.config import (ActorConfig, CriticConfig, ModelConfig, RefConfig,
                                       RewardConfig, RolloutConfig)

__all__ = ["ConfigError", "RunConfig", "build_config", "parse_overrides", "run_values",
           "RUN_SECTIONS"]

MAX_STOP_TIMEOUT_S = 7 * 24 * 3600  # trainer.stop_timeout_s: a week is past any scheduler's grace


@dataclass
class TrainerConfig:
    steps: int = checked(40, at_least(1))
    seed: int = checked(1, at_least(0))
    val_every: int = checked(10, at_least(0))     # 0 disables validation
    # N of mean@N / best@N; bounded: each validation prompt is sampled N times (issue 32)
    val_samples: int = checked(4, in_range(1, 1024))
    save_every: int = checked(0, at_least(0))     # 0 saves only at the end
    max_checkpoints: int = checked(2, at_least(0))  # 0 keeps them all
    runs_dir: str = "runs"
    run_name: Optional[str] = checked(None, plain_name)  # a directory in runs_dir
    progress: bool = True
    tensorboard: bool = False
    wandb: bool = False
    check_finite: bool = True    # stop on NaN/inf in losses or rewards
    # refuse to start a CPU run whose predicted peak memory exceeds this machine's
    check_memory: bool = True
    # sample generations (prompt, response, score) to generations.jsonl, TensorBoard,
    # W&B: N of each training step's (0: none), N of each validation's (also printed)
    log_generations: int = checked(0, at_least(0))
    log_val_generations: int = checked(4, at_least(0))
    # async: generate up to `staleness` steps ahead of training (0: synchronous)
    staleness: int = checked(0, at_least(0))
    allow_uncorrected_async: bool = False  # train stale samples with no off-policy correction
    # how the rollout runs ahead (staleness >= 1): "pipeline" generates whole batches k
    # steps ahead; "streaming" generates continuously and hands over groups as they
    # finish (docs/async.md)
    async_mode: str = checked(AsyncMode.PIPELINE.value, one_of(*AsyncMode.names(),
                                                               what="trainer.async_mode"))
    # streaming: "auto" runs the rule-based nodes, group functions and a reference
    # colocated with the rollout on the stream side; "generate_only" keeps them on
    # the train side (docs/async.md, "Which nodes go on which side")
    stream_side: str = checked(StreamSide.AUTO.value, one_of(*StreamSide.names(),
                                                             what="trainer.stream_side"))
    # reorder each generated batch so data-parallel ranks get equal tokens (plan/balance.py)
    balance_batch: bool = False
    # keep the nodes the compiler finds unneeded (plan/unneeded.py: old log-probs when
    # the update makes one optimizer step per batch); `check` says which and why
    keep_unneeded_passes: bool = False
    # steps whose batches (every node's output) are written to RUN_DIR/batches/ (run/batch_dump.py)
    dump_batches: list[int] = field(default_factory=list)
    # the first SIGTERM/SIGINT lets the step end and saves; past this, it stops at once
    # (at most a week: a timer's wait cannot be longer than the platform's time_t allows)
    stop_timeout_s: float = checked(60.0, in_range(0, MAX_STOP_TIMEOUT_S, open_low=True))
    # validate once (the checkpoint of --resume RUN_DIR, or model.path), train nothing
    val_only: bool = False


@dataclass
class ToyTaskConfig:
    max_operand: int = checked(9, at_least(1))
    test_fraction: float = checked(0.25, in_range(0, 1, open_low=True, open_high=True))
    train_on_test: bool = False  # also train on the held-out pairs (base-model SFT only)
    # makes the rows: maker(seed, max_operand, test_fraction, train_on_test) -> (train, test)
    maker: str = checked(DEFAULT_TOY_MAKER, named_object("the toy data maker", True))


@dataclass
class DataConfig:
    train_files: Optional[str] = None   # parquet/JSONL in verl's schema; None = toy task
    val_files: Optional[str] = None
    batch_size: int = checked(16, at_least(1))          # prompts per step
    max_prompt_length: int = checked(16, at_least(1))
    filter_overlong: bool = True
    shuffle: bool = True
    toy: ToyTaskConfig = field(default_factory=ToyTaskConfig)


def _device_problem(key: str, value) -> str | None:
    from hybridflow.planner.devices import get_device
    try:
        get_device(str(value))
    except ValueError as err:
        return f"{key}: {err}"
    return None


def known_device() -> Rule:
    """A device the planner knows: a built-in row, or a user entry (plan --measure-device)."""
    return Rule(lambda v: _device_problem("", v) is None, "name a known device",
                message=_device_problem)


@dataclass
class ClusterConfig:
    """What `placement.auto` plans for."""
    nodes: int = checked(1, at_least(1))
    devices_per_node: int = checked(1, at_least(1))
    device: str = checked("cpu", known_device())  # a100-80g | h100-80g | h200-141g | cpu ...


def core_ids() -> Rule:
    """A non-empty list of distinct CPU core ids (placement.pools.<name>.cores)."""
    def ok(value) -> bool:
        ids = list(value)
        return bool(ids) and all(int(c) >= 0 for c in ids) and len(set(ids)) == len(ids)
    return Rule(ok, "be a non-empty list of distinct core ids (each 0 or more)")


@dataclass
class PoolConfig:
    """One resource pool: `placement.pools.<name>`."""
    nodes: int = checked(1, at_least(1))
    devices_per_node: int = checked(1, at_least(1))
    # Ray: pin its workers to these cores (an equal slice for each device of a node;
    # hybridflow/runtime/affinity.py); None: the OS places them
    cores: Optional[list[int]] = checked(None, core_ids())


@dataclass
class ParallelConfig:
    """A role's parallel layout: `placement.parallel.<role>`."""
    dp: Optional[int] = checked(None, at_least(1))  # None: the pool's devices / tp
    tp: int = checked(1, at_least(1))
    sp: int = checked(1, at_least(1))  # ranks splitting a row's positions (Ulysses)


@dataclass
class PlacementConfig:
    pools: dict[str, PoolConfig] = field(default_factory=lambda: {"main": PoolConfig()})
    roles: dict[str, str] = field(default_factory=dict)  # unset roles go to the first pool
    parallel: dict[str, ParallelConfig] = field(default_factory=dict)
    auto: bool = False           # run the planner and use its best placement
    cluster: ClusterConfig = field(default_factory=ClusterConfig)


class _DeprecatedMapping:
    """`dict(cfg)`, `cfg["actor"]`, `cfg.keys()`, `"x" in cfg`: what a worker written
    against the docs before the typed RunConfig (when `cfg` was a DictConfig) did. It
    still works, giving each section as a plain dict, with a FutureWarning once per
    process saying what to write instead (docs/workers.md#migrating-a-worker-class)."""

    _warned = [False]

    def _deprecated(self) -> None:
        if not self._warned[0]:
            self._warned[0] = True
            warnings.warn(
                "reading the run config as a mapping (dict(cfg), cfg['section']) is "
                "deprecated: workers receive a typed RunConfig; read a section with "
                "hybridflow.core.sections.read_section(cfg, 'actor', ActorConfig) or "
                "cfg.<section> (docs/workers.md#migrating-a-worker-class)",
                FutureWarning, stacklevel=3)

    def keys(self):
        self._deprecated()
        return list(vars(self))

    def __iter__(self):
        return iter(self.keys())

    def __len__(self) -> int:
        return len(vars(self))

    def __contains__(self, name) -> bool:
        self._deprecated()
        return name in vars(self)

    def __getitem__(self, name: str):
        self._deprecated()
        if name not in vars(self):
            raise KeyError(f"the run config has no section {name!r}; it has {sorted(vars(self))}")
        value = getattr(self, name)
        return dataclasses.asdict(value) if dataclasses.is_dataclass(value) else value

    def get(self, name: str, default=None):
        return self[name] if name in vars(self) else default


@dataclass
class RunConfig(_DeprecatedMapping):
    """The run's sections. `run_values` gives an instance; a role bound in `workers`
    beyond these has its section as an attribute of the role's name."""
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
    algorithm: Any = field(default_factory=dict)  # the graph's: its ALGORITHM, or free-form


RUN_SECTIONS = tuple(f.name for f in dataclasses.fields(RunConfig))
# sections that are not a role's: a role of these names would have no section of its own
_NOT_ROLES = ("trainer", "data", "runtime", "placement", "workers", "algorithm", "model")


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
        if "is not a ListConfig" in detail:  # omegaconf's words for a scalar given a list key
            detail = f"it takes a list, e.g. {key}=[0,1] (a YAML list in a file)"
        return ConfigError(f"{source}: bad value for '{key}': {detail}")
    known = [k for k in _known_keys(cfg) if not str(key).startswith(k + ".")]  # not parents
    close = _closest(str(key), known)
    hint = f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
    section = str(key).split(".")[0]
    if not close and section not in cfg:  # perhaps the section of a role not bound yet
        hint = (f"; a role's own section needs the role bound: "
                f"workers.{section}=module:Class")
    return ConfigError(f"{source}: unknown config key '{key}'{hint}")


def _closest(key: str, known: list[str]) -> list[str]:
    """The known keys closest to `key`: for a key without its section (`steps`), first
    the dotted keys that end in it (`trainer.steps`), then the closest keys, then the
    dotted keys ending in a name close to it."""
    close = difflib.get_close_matches(key, known, n=3, cutoff=0.6)
    if "." in key:
        return close
    leaves: dict[str, list[str]] = {}
    for name in known:
        if "." in name:
            leaves.setdefault(name.rsplit(".", 1)[-1], []).append(name)
    exact = leaves.get(key, [])
    near = difflib.get_close_matches(key, list(leaves), n=3, cutoff=0.75)
    return (exact or close or [k for leaf in near for k in leaves[leaf]])[:3]


def _check_sections(base: DictConfig, other, source: str, prefix: str = "") -> None:
    """A section (or sub-section) given a scalar (`trainer: 5`) is named as such:
    omegaconf's own message names no key."""
    if not isinstance(other, DictConfig):
        return
    for key in other.keys():
        if key not in base or not isinstance(base._get_node(key), DictConfig):
            continue
        value = other._get_node(key)
        path = f"{prefix}{key}"
        if isinstance(value, DictConfig):
            if not value._is_missing() and not value._is_none():
                _check_sections(base._get_node(key), value, source, path + ".")
            continue
        shown = value._value() if hasattr(value, "_value") else value
        raise ConfigError(f"{source}: '{path}' is a section of keys, not a value (got "
                          f"{shown!r}); give its keys, e.g. {path}.<key>=... or in YAML "
                          f"'{path.split('.')[-1]}:' with indented 'key: value' lines")


def parse_overrides(items: list[str]) -> list[str]:
    from hybridflow.program.config_text import check_override_text
    check_override_text(items)  # before YAML's reader sees a control character
    for item in items:
        if "=" not in item or item.startswith("="):
            raise ConfigError(f"override {item!r} is not of the form key=value "
                              f"(e.g. trainer.steps=100)")
    return list(items)


def _merge(base: DictConfig, other, source: str) -> DictConfig:
    _check_sections(base, other, source)
    try:
        return OmegaConf.merge(base, other)
    except (ConfigKeyError, ConfigAttributeError, ValidationError) as err:
        raise _explain(err, base, source) from None


def _load_yaml(yaml_file: str) -> DictConfig:
    from hybridflow.core.loading import read_yaml
    loaded = read_yaml(yaml_file, "config file")
    if not isinstance(loaded, DictConfig):
        raise ConfigError(f"config file {yaml_file!r} must hold a mapping of sections "
                          f"(trainer:, data:, ...), not a {type(loaded).__name__}")
    return loaded


def _sources(graph_defaults, yaml_file, overrides) -> list[tuple[str, DictConfig]]:
    """(name for messages, values) in merge order."""
    sources = []
    if graph_defaults:
        sources.append(("graph defaults()", OmegaConf.create(graph_defaults)))
    if yaml_file:
        from hybridflow.program.config_text import check_config_text
        loaded = _load_yaml(yaml_file)
        check_config_text(loaded, yaml_file)
        sources.append((yaml_file, loaded))
    if overrides:
        sources.append(("override", OmegaConf.from_dotlist(parse_overrides(overrides))))
    return sources


def _schema(cls: type | None, where: str) -> DictConfig:
    """A section typed by the dataclass `cls`, or a free-form one when None."""
    if cls is None:
        section = OmegaConf.create({})
        OmegaConf.set_struct(section, False)
        return section
    if not (isinstance(cls, type) and dataclasses.is_dataclass(cls)):
        raise ConfigError(f"{where} must be a dataclass (the section's fields and "
                          f"defaults), got {cls!r}")
    return OmegaConf.structured(cls)


def _add_role_sections(cfg: DictConfig, sources, role_schema) -> None:
    """A section for each role bound in `workers` that has none: its worker class's
    `config_schema` (via `role_schema(role, spec)`), or free-form."""
    workers: dict = {}
    for _, values in sources:
        if isinstance(values.get("workers"), DictConfig):
            workers.update(OmegaConf.to_container(values.workers, resolve=True))
    for role, spec in workers.items():
        if role in _NOT_ROLES:
            raise ConfigError(f"workers.{role}: '{role}' is a section of the run, not a "
                              f"role; give the role another name")
        if role in RUN_SECTIONS:
            continue
        schema = role_schema(role, str(spec)) if role_schema else None
        with open_dict(cfg):
            cfg[role] = _schema(schema, f"the config_schema of workers.{role}={spec}")


def build_config(graph_defaults: dict | None = None, yaml_file: str | None = None,
                 overrides: list[str] | None = None, *, algorithm: type | None = None,
                 role_schema: Callable[[str, str], type | None] | None = None) -> DictConfig:
    """The merged, validated run config (struct mode: no new keys after this).

    `algorithm`: the graph file's `ALGORITHM` dataclass (None: a free-form section).
    `role_schema(role, "module:Class")`: the dataclass of a bound role's own section
    (None: free-form)."""
    sources = _sources(graph_defaults, yaml_file, overrides)
    cfg = OmegaConf.structured(RunConfig)
    if algorithm is not None:
        with open_dict(cfg):
            cfg.algorithm = _schema(algorithm, "the graph's ALGORITHM")
    _add_role_sections(cfg, sources, role_schema)
    for name, values in sources:
        cfg = _merge(cfg, values, name)
    try:
        OmegaConf.to_container(cfg, resolve=True)  # every ${...} resolves, or one line
    except InterpolationResolutionError as err:
        key = getattr(err, "full_key", None) or "?"
        detail = str(getattr(err, "msg", err)).splitlines()[0]
        raise ConfigError(f"config key '{key}': its interpolation does not resolve "
                          f"({detail}); fix or remove the ${{...}} it holds") from None
    check_values(cfg)
    _check_consistency(cfg)
    _freeze(cfg)
    return cfg


def _freeze(cfg: DictConfig) -> None:
    """Struct mode everywhere, free-form sections included: no new keys after this."""
    OmegaConf.set_struct(cfg, True)
    for key in cfg.keys():
        node = cfg._get_node(key)
        if isinstance(node, DictConfig):
            OmegaConf.set_struct(node, None)  # inherit the root's flag


def run_values(cfg: DictConfig) -> RunConfig:
    """The config as typed values, converted once and passed down to the workers:
    each section a dataclass instance (a free-form role section a dict). The
    `algorithm` section stays a plain dict: it is the graph's, read by `build(cfg)`,
    and a graph file's classes cannot be unpickled by Ray workers."""
    values = OmegaConf.to_object(cfg)
    algorithm = cfg.algorithm
    values.algorithm = OmegaConf.to_container(algorithm, resolve=True) \
        if isinstance(algorithm, DictConfig) else algorithm
    return values


def _check_consistency(cfg: DictConfig) -> None:
    """What no single field can say: values that must agree with each other."""
    rows = cfg.data.batch_size * cfg.rollout.n
    mini = cfg.actor.mini_batch_size
    if mini and mini > rows:
        raise ConfigError(f"actor.mini_batch_size={mini} is larger than the batch of "
                          f"data.batch_size * rollout.n = {rows} responses")
    # a micro-batch larger than the mini-batch is fine: the mini-batch is one micro-batch
    _check_names(cfg)


def _check_names(cfg: DictConfig) -> None:
    """Names that no field rule can check. (The default losses' names, e.g.
    actor.policy_loss, are fields checked against the registry the loss providers
    fill: workers/config.py.)"""
    from hybridflow.workers.models import resolve_dtype
    try:
        resolve_dtype(cfg.model.dtype)
    except ValueError as err:
        raise ConfigError(f"model.dtype: {err}") from None
