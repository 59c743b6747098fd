"""Argument parsing shared by the commands: every number an option takes that sizes
work (rows, nodes, devices, tokens, plans) declares its range here (`count`,
`number`), so a value that cannot be meant is an argparse error naming the option
(exit 2) before any work starts, never minutes of silence (issue 32, class 4)."""
from __future__ import annotations

import argparse
import math

__all__ = ["SafeParser", "IntermixedParser", "count", "number"]


def count(low: int, high: int, why: str = ""):
    """An argparse type: an integer in [low, high]; `why` says what the bound means."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"{value} is too small: at least {low:,}"
                                             + (f" ({why})" if why else ""))
        if value > high:
            raise argparse.ArgumentTypeError(f"{value:,} is too large: at most {high:,}"
                                             + (f" ({why})" if why else ""))
        return value
    parse.bounds = (low, high)
    parse.__name__ = "count"  # argparse names the type in its messages
    return parse


def number(low: float, high: float, open_ends: bool = False):
    """An argparse type: a finite float in [low, high] (or (low, high) if `open_ends`)."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        inside = low < value < high if open_ends else low <= value <= high
        if not math.isfinite(value) or not inside:
            ends = "both excluded" if open_ends else "both included"
            raise argparse.ArgumentTypeError(f"{value} is not between {low:g} and {high:g} "
                                             f"({ends})")
        return value
    parse.bounds = (low, high)
    parse.__name__ = "number"
    return parse


class SafeParser(argparse.ArgumentParser):
    """argparse's own messages quote the command line (`unrecognized arguments: ...`):
    they reach the terminal through `printable` like every other message."""

    def _print_message(self, message, file=None):
        from hybridflow.core.printable import printable
        super()._print_message(printable(message) if message else message, file)


class IntermixedParser(SafeParser):
    """Lets `key=value` overrides follow options (`run g.py --runtime ray trainer.steps=4`):
    plain argparse binds all positionals at their first run and rejects later ones."""
    _intermixing = False

    def parse_known_args(self, args=None, namespace=None):
        if self._intermixing:
            return super().parse_known_args(args, namespace)
        self._intermixing = True
        try:
            return self.parse_known_intermixed_args(args, namespace)
        finally:
            self._intermixing = False
