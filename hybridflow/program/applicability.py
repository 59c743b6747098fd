"""When each config key applies: one table, one rule.

A setting that does nothing must say so. Each key whose effect depends on the run
declares here when it applies -- the rollout engine, the async mode, the runtime, a
range of steps, another key it needs -- and what a set key that does not apply gets:
`refuse` (a ConfigError: the run would silently do something else than asked) or
`warn` (a line `hybridflow: warning: ...` on stderr: the key is ignored). A key is
*set* when its value differs from its schema default (`RunConfig`);
`check_applicable` reads the table before launch (in the pre-flight that `check` and
`run` share) and knows no key by name. A key may name every entry of a mapping with
`*` (`placement.pools.*.cores`: each pool's).

Stateless: the table `APPLIES` is fixed at import.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any, Callable

from omegaconf import DictConfig, OmegaConf

from hybridflow.core.constraints import ConfigError
from hybridflow.core.modes import RuntimeName, run_modes

__all__ = ["Applies", "APPLIES", "check_applicable", "rule_of", "set_keys"]


@dataclass(frozen=True)
class Applies:
    """`why_not(cfg, value)`: None when the key applies to a run of `cfg`, else the
    reason it does not; `when`: the rule in words (docs, messages)."""
    when: str
    why_not: Callable[[DictConfig, Any], str | None]
    action: str = "warn"  # "warn" | "refuse"
    # the key that turns the key's feature off (trainer.val_every=0: no validation). Set,
    # the feature is off by the user's choice and its keys are moot, not mistaken: a
    # shipped config's trainer.val_samples=1 under trainer.val_every=0 is not warned of
    switch: str | None = None


def _select(cfg: DictConfig, key: str):
    return OmegaConf.select(cfg, key)


def engine(*names: str) -> Callable:
    def why_not(cfg, value):
        backend = str(cfg.rollout.backend)
        return None if backend in names else f"rollout.backend={backend!r}"
    return why_not


def streaming(cfg, value) -> str | None:
    mode, k = cfg.trainer.async_mode, cfg.trainer.staleness
    return None if run_modes(cfg).async_mode.streams and k >= 1 else \
        f"trainer.async_mode={mode!r}, trainer.staleness={k}"


def asynchronous(cfg, value) -> str | None:
    k = cfg.trainer.staleness
    return None if k >= 1 else f"trainer.staleness={k} (synchronous)"


def cluster_runtime(cfg, value) -> str | None:
    used = cfg.runtime.name
    return None if run_modes(cfg).runtime.joins_cluster else f"runtime.name={used!r}"


def within_steps(cfg, value) -> str | None:
    steps = cfg.trainer.steps
    outside = sorted(int(s) for s in value if not 1 <= int(s) <= steps)
    return None if not outside else \
        f"trainer.steps={steps}: step(s) {outside} never run"


def needs(key: str) -> Callable:
    def why_not(cfg, value):
        return None if _select(cfg, key) else f"{key} is not set"
    return why_not


def unless(key: str) -> Callable:
    def why_not(cfg, value):
        other = _select(cfg, key)
        return None if not other else f"{key}={other!r} replaces it"
    return why_not


def validating(cfg, value) -> str | None:
    every = cfg.trainer.val_every
    return None if every > 0 else f"trainer.val_every={every} (no validation)"


_VLLM = ("vllm only", engine("vllm"))
_CLUSTER = "runtime.name=" + " or ".join(m for m in RuntimeName if m.joins_cluster)
APPLIES: dict[str, Applies] = {
    **{f"rollout.{key}": Applies(*_VLLM) for key in (
        "gpu_memory_utilization", "kv_cache_gib", "enforce_eager", "max_model_len",
        "max_num_seqs")},
    "rollout.enable_sleep_mode": Applies(*_VLLM),
    "rollout.hf_loop": Applies("rollout.backend=hf", engine("hf")),
    "rollout.stream_poll_steps": Applies("trainer.async_mode=streaming", streaming),
    "rollout.partial": Applies("trainer.async_mode=streaming", streaming),
    "trainer.stream_side": Applies("trainer.async_mode=streaming", streaming),
    "trainer.async_mode": Applies("trainer.staleness >= 1", asynchronous),
    "trainer.allow_uncorrected_async": Applies("trainer.staleness >= 1", asynchronous),
    "trainer.dump_batches": Applies("steps 1..trainer.steps", within_steps, "refuse"),
    **{f"trainer.{key}": Applies("trainer.val_every > 0", validating,
                                 switch="trainer.val_every")
       for key in ("val_samples", "log_val_generations")},
    "data.val_files": Applies("with data.train_files (else the toy task validates)",
                              needs("data.train_files"), "refuse"),
    **{f"data.toy.{key}": Applies("without data.train_files (the toy task)",
                                  unless("data.train_files"))
       for key in ("max_operand", "test_fraction", "train_on_test", "maker")},
    "runtime.address": Applies(_CLUSTER, cluster_runtime, "refuse"),
    **{f"runtime.{key}": Applies(_CLUSTER, cluster_runtime) for key in (
        "listen_all", "num_cpus", "num_gpus", "start_timeout_s", "connect_timeout_s")},
    # `*`: every name under the mapping (each pool); the local runtime has one process
    "placement.pools.*.cores": Applies(_CLUSTER, cluster_runtime),
}


def _defaults() -> DictConfig:
    from hybridflow.program.config import RunConfig
    return OmegaConf.structured(RunConfig)


def set_keys(cfg: DictConfig, keys=None) -> dict[str, Any]:
    """{key: value} of the table's keys (or `keys`) whose value differs from the schema
    default: the keys a user (or a graph's defaults) set."""
    base, out = _defaults(), {}
    for key in (k for pattern in (keys if keys is not None else APPLIES)
                for k in _expand(cfg, pattern)):
        value = _select(cfg, key)
        plain = OmegaConf.to_container(value) if isinstance(value, (DictConfig,)) or \
            OmegaConf.is_list(value) else value
        if plain != _plain(_select(base, key)):
            out[key] = plain
    return out


def _expand(cfg: DictConfig, pattern: str) -> list[str]:
    """A table key, with `*` replaced by each name under its mapping in `cfg`
    (`placement.pools.*.cores` -> one key per pool)."""
    if ".*." not in pattern:
        return [pattern]
    head, tail = pattern.split(".*.", 1)
    names = _select(cfg, head)
    return [f"{head}.{name}.{tail}" for name in (names or {})]


def rule_of(key: str) -> Applies:
    """The table's declaration of `key`, directly or through a `*` pattern."""
    if key in APPLIES:
        return APPLIES[key]
    parts = key.split(".")
    for pattern, rule in APPLIES.items():
        names = pattern.split(".")
        if len(names) == len(parts) and all(n in ("*", p) for n, p in zip(names, parts)):
            return rule
    raise KeyError(key)


def _plain(value):
    return OmegaConf.to_container(value) if OmegaConf.is_config(value) else value


def check_applicable(cfg: DictConfig) -> list[str]:
    """Refuse (ConfigError) a set key whose declaration says `refuse` when it does not
    apply; warn on stderr for the others; returns the warnings' text."""
    said, chosen = [], set_keys(cfg)
    for key, value in chosen.items():
        rule = rule_of(key)
        why = rule.why_not(cfg, value)
        if why is None or (rule.action == "warn" and _switched_off(rule, cfg)):
            continue
        text = (f"{key}={value!r} has no effect in this run: it applies {rule.when}, "
                f"and here {why}")
        if rule.action == "refuse":
            raise ConfigError(f"{text}; remove it or change the run so that it applies")
        said.append(f"{text}; it is ignored")
        say(f"hybridflow: warning: {said[-1]}")
    return said


def _switched_off(rule: Applies, cfg: DictConfig) -> bool:
    """Whether the user turned the rule's feature off (its switch differs from the
    schema default)."""
    return rule.switch is not None and bool(set_keys(cfg, [rule.switch]))


def say(text: str) -> None:
    """A warning on the console, once per check (stderr, made printable)."""
    from hybridflow.core.printable import echo
    echo(text, file=sys.stderr)
