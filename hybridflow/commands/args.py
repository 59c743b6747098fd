"""Argument parsing shared by the commands: every number an option takes that sizes
work (rows, nodes, devices, tokens, plans) declares its range here (`count`,
`number`), so a value that cannot be meant is an argparse error naming the option
(exit 2) before any work starts, never minutes of silence (issue 32, class 4)."""
from __future__ import annotations

import argparse
import math

__all__ = ["SafeParser", "IntermixedParser", "count", "number", "add_run_arguments",
           "resume_word", "run_overrides", "NEWEST"]

NEWEST = "__newest__"  # `--resume` without a directory: the newest run of the graph


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


def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments of `run`, which `check` takes too (issue 36: `check` is `run`
    without the workers): the same command line is checked, then run."""
    from hybridflow.core.modes import RuntimeName
    parser.add_argument("graph", help="a graph file exporting build(cfg), e.g. graphs/grpo.py")
    parser.add_argument("overrides", nargs="*", metavar="key=value")
    parser.add_argument("-c", "--config", help="YAML config file, merged before overrides")
    parser.add_argument("--runtime", choices=RuntimeName.names(), help="default: runtime.name")
    parser.add_argument("--address", help="join this Ray cluster (implies --runtime ray)")
    parser.add_argument("--resume", nargs="?", const=NEWEST, metavar="RUN_DIR",
                        help="continue a run from its last checkpoint (default: the newest "
                             "run of this graph)")


def resume_word(args) -> None:
    """`--resume key=value`: the optional RUN_DIR of --resume took an override (argparse
    binds the next word); a key=value that is not a directory is an override, and
    --resume means the newest run."""
    import os
    word = args.resume
    if word not in (None, NEWEST) and "=" in word and not os.path.isdir(word):
        args.overrides = [*args.overrides, word]
        args.resume = NEWEST


def run_overrides(args) -> list[str]:
    """The overrides plus what --runtime and --address set (ConfigError when they
    contradict each other)."""
    from hybridflow.core.constraints import ConfigError
    from hybridflow.core.modes import RuntimeName
    extra = list(args.overrides)
    if args.address and not RuntimeName.of(args.runtime or RuntimeName.RAY).joins_cluster:
        raise ConfigError(f"--runtime local and --address {args.address} contradict each "
                          f"other: --address joins a Ray cluster; drop one of them")
    if args.runtime:
        extra.append(f"runtime.name={args.runtime}")
    if args.address:
        extra += [f"runtime.name={RuntimeName.RAY}", f"runtime.address={args.address}"]
    return extra
