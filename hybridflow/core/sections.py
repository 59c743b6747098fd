"""Reading one typed section out of a run config: `read_section(cfg, "actor", ActorConfig)`.

`cfg` may be a DictConfig, a dict, a dataclass (the typed `RunConfig`) or absent; a section
already of the type comes back as it is, a mapping is built into it (nested dataclasses
too) and an unknown key is refused naming the section and the keys it knows. Stateless.
"""
from __future__ import annotations

import dataclasses
from typing import Any

__all__ = ["read_section"]


def _as_plain(value: Any) -> Any:
    try:
        from omegaconf import DictConfig, ListConfig, OmegaConf
        if isinstance(value, (DictConfig, ListConfig)):
            return OmegaConf.to_container(value, resolve=True)
    except ImportError:  # pragma: no cover - omegaconf is a dependency
        pass
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    return value


def _build(cls, values: dict, where: str):
    known = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - set(known))
    if unknown:
        raise ValueError(f"config section '{where}' has unknown key(s) {unknown}; "
                         f"known keys: {sorted(known)}")
    kwargs = {}
    for name, value in values.items():
        sub = known[name].default_factory if known[name].default_factory \
            is not dataclasses.MISSING else None
        if isinstance(value, dict) and sub is not None and dataclasses.is_dataclass(sub):
            value = _build(sub, value, f"{where}.{name}")
        kwargs[name] = value
    return cls(**kwargs)


def read_section(cfg: Any, name: str, cls):
    """`cfg.<name>` (DictConfig, dict, dataclass or absent) as an instance of `cls`."""
    if isinstance(cfg, dict) or cfg is None:
        section = (cfg or {}).get(name)
    else:
        section = getattr(cfg, name, None)
    if section is None:
        return cls()
    if isinstance(section, cls):
        return section
    section = _as_plain(section)
    if not isinstance(section, dict):
        raise TypeError(f"config section '{name}' must be a mapping, got "
                        f"{type(section).__name__}")
    return _build(cls, section, name)
