"""Name lookup shared by the registries of advantages, policy losses and scorers."""
from __future__ import annotations

from typing import Mapping, TypeVar

Entry = TypeVar("Entry")


def lookup(table: Mapping[str, Entry], name: str, what: str) -> Entry:
    """`table[name]`, or a ValueError naming the unknown name and the valid ones."""
    try:
        return table[name]
    except (KeyError, TypeError):
        valid = ", ".join(sorted(table))
        raise ValueError(f"unknown {what} {name!r}; valid names: {valid}") from None
