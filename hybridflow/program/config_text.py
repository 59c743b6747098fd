"""Control characters in configuration text: refused before any parser sees them, with
one line naming the source, the key and the character.

A value is a name, a path, a number or a template; a control character in one is a
paste from a terminal or an attack on the next reader's terminal (an escape sequence
in `trainer.run_name` becomes a directory name, then every `status` line). On the
command line every control character is refused (C0, DEL, C1) and so is every
character `core/printable.py` would escape (bidi overrides, line separators): YAML's
reader would otherwise fail on some with its own traceback and keep others. In a
config file, tabs and newlines are YAML's own (block scalars hold them); the rest is
refused the same way. Stateless.
"""
from __future__ import annotations

import unicodedata

from omegaconf import DictConfig, ListConfig

from hybridflow.core.constraints import ConfigError
from hybridflow.core.printable import MISUSED

__all__ = ["check_override_text", "check_config_text", "refused_character"]

_FILE_ALLOWED = "\t\n\r"


def refused_character(text: str, in_file: bool = False) -> str | None:
    """The first character of `text` that configuration may not hold, or None."""
    for char in text:
        if in_file and char in _FILE_ALLOWED:
            continue
        if char in MISUSED or unicodedata.category(char) == "Cc":
            return char
    return None


def _shown(text: str) -> str:
    """`text` with each refused character as its escape, for the message."""
    return "".join(c if refused_character(c) is None else
                   f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}"
                   for c in text)


def _refuse(source: str, key: str, char: str, part: str) -> ConfigError:
    where = f"{source} {_shown(key)}" if source == "override" else f"{source}: key {_shown(key)}"
    return ConfigError(f"{where}: control character U+{ord(char):04X} is not "
                       f"allowed in a config {part}; remove it")


def check_override_text(items: list[str]) -> None:
    """Each `key=value` of the command line, before OmegaConf parses it."""
    for item in items:
        key, _, value = item.partition("=")
        for part, text in (("key", key), ("value", value)):
            char = refused_character(text)
            if char is not None:
                raise _refuse("override", key, char, part)


def check_config_text(values, source: str, prefix: str = "") -> None:
    """Every key and string value of a loaded config (a file's, or graph defaults')."""
    if isinstance(values, DictConfig):
        items = [(str(k), values._get_node(k)) for k in values.keys()]
    elif isinstance(values, ListConfig):
        items = [(f"[{i}]", values._get_node(i)) for i in range(len(values))]
    else:
        return
    for name, node in items:
        key = f"{prefix}.{name}" if prefix and not name.startswith("[") else prefix + name
        char = refused_character(name, in_file=True)
        if char is not None:
            raise _refuse(source, key, char, "key")
        if isinstance(node, (DictConfig, ListConfig)):
            if not node._is_missing() and not node._is_none():
                check_config_text(node, source, key)
            continue
        value = node._value() if hasattr(node, "_value") else node
        char = refused_character(value, in_file=True) if isinstance(value, str) else None
        if char is not None:
            raise _refuse(source, key, char, "value")
