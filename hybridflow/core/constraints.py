"""The allowed values of each config field, declared next to the field.

A config dataclass (the run's sections in `program/config.py` and `workers/config.py`, a
graph file's `ALGORITHM`, a worker's `config_schema`) gives a field its rule with
`checked`:

    lr: float = checked(1e-6, at_least(0))
    temperature: float = checked(1.0, above(0))

`check_values` walks a merged config and refuses, before anything starts, a value
outside its rule, and any float that is NaN or infinite, naming the full dotted key,
the value and what is allowed. A value of None (an Optional field left unset) is
not checked. Types are omegaconf's business (it refuses `trainer.steps=abc`).
Stateless.
"""
from __future__ import annotations

import dataclasses
import difflib
import math
from dataclasses import dataclass
from typing import Any, Callable

__all__ = ["ConfigError", "Rule", "checked", "at_least", "above", "in_range", "probability",
           "one_of", "plain_name", "pair_in_range", "check_values"]


class ConfigError(ValueError):
    """A configuration mistake the user can fix; the message names the key."""


@dataclass(frozen=True)
class Rule:
    """`test(value)` is True for an allowed value; the message reads
    "<key> must <allowed>, got <value>", or `message(key, value)` when given."""
    test: Callable[[Any], bool]
    allowed: str
    message: Callable[[str, Any], str] | None = None


def checked(default: Any = dataclasses.MISSING, rule: Rule | None = None, *,
            factory: Callable[[], Any] | None = None):
    """A dataclass field with `default` (or `factory` for lists and dicts) and its rule."""
    metadata = {"rule": rule} if rule is not None else {}
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def at_least(low: float) -> Rule:
    allowed = "not be negative" if low == 0 else f"be at least {low}"
    return Rule(lambda v: _number(v) and v >= low, allowed)


def above(low: float) -> Rule:
    return Rule(lambda v: _number(v) and v > low, f"be greater than {low}")


def in_range(low: float, high: float, *, open_low: bool = False,
             open_high: bool = False) -> Rule:
    """Within [low, high]; `open_low`/`open_high` exclude that end."""
    def test(v) -> bool:
        return _number(v) and (v > low if open_low else v >= low) and \
            (v < high if open_high else v <= high)
    return Rule(test, f"be in {'(' if open_low else '['}{low}, {high}{')' if open_high else ']'}")


probability = in_range(0, 1)


def one_of(*names: str, what: str | None = None) -> Rule:
    """One of `names`; with `what` (e.g. 'lr schedule') the message also suggests the
    closest name."""
    def message(key: str, value: Any) -> str:
        close = difflib.get_close_matches(str(value), names, n=1, cutoff=0.5)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        if str(value) in ("True", "False"):  # YAML 1.1 reads on/off/yes/no as booleans
            hint = (f"; YAML read the word as the boolean {value} (as it reads on, off, yes "
                    f"and no): quote a name, e.g. {key}='{names[0]}'")
        return f"{key}={value!r} is not a known {what}{hint} (valid: {', '.join(names)})"
    return Rule(lambda v: v in names, "be " + " or ".join(repr(n) for n in names),
                message if what else None)


def _is_plain_name(value: Any) -> bool:
    text = str(value)
    return bool(text) and text not in (".", "..") and not any(
        sep in text for sep in ("/", "\\", "\0"))


plain_name = Rule(_is_plain_name, "be a plain name (no '/', '\\' or '..': it names a "
                                  "directory inside trainer.runs_dir)")


def pair_in_range(low: float, high: float) -> Rule:
    """Two numbers in [low, high) (e.g. Adam's betas)."""
    return Rule(lambda v: isinstance(v, (list, tuple)) and len(v) == 2
                and all(_number(b) and low <= b < high for b in v),
                f"be two numbers in [{low}, {high})")


def _fail(key: str, value: Any, rule: Rule) -> ConfigError:
    if rule.message is not None:
        return ConfigError(rule.message(key, value))
    return ConfigError(f"{key} must {rule.allowed}, got {value!r}")


def _check_leaf(key: str, value: Any, rule: Rule | None) -> None:
    if value is None:
        return
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"{key} must be a finite number, got {value!r}")
    if rule is not None and not rule.test(value):
        raise _fail(key, value, rule)


def check_values(node: Any, prefix: str = "") -> None:
    """Every field of `node` (a DictConfig typed by a dataclass, or a dataclass
    instance) against its rule, recursively; untyped (free-form) mappings, and keys a
    typed node holds beyond its fields (a role's own section), are walked too."""
    from omegaconf import DictConfig, ListConfig, OmegaConf
    schema = OmegaConf.get_type(node) if isinstance(node, DictConfig) else type(node)
    fields = dataclasses.fields(schema) if dataclasses.is_dataclass(schema) else ()
    for field in fields:
        _check_field(getattr(node, field.name, None), f"{prefix}{field.name}",
                     field.metadata.get("rule"))
    if isinstance(node, DictConfig):
        declared = {f.name for f in fields}
        for key in node:
            value = node._get_node(key)
            if key not in declared and not isinstance(value, ListConfig):
                _check_field(value if isinstance(value, DictConfig) else node[key],
                             f"{prefix}{key}", None)


def _check_field(value: Any, key: str, rule: Rule | None) -> None:
    from omegaconf import DictConfig, ListConfig, OmegaConf
    if isinstance(value, DictConfig) or dataclasses.is_dataclass(value):
        check_values(value, key + ".")
        return
    if isinstance(value, ListConfig):
        value = OmegaConf.to_container(value, resolve=True)
    _check_leaf(key, value, rule)
