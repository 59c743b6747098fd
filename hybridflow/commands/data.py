"""`hybridflow data toy|word_arith --out DIR [--format jsonl|parquet]`: write a task's
train and test files in verl's schema.

- `toy`: the embedded default's task ("7+5=" -> "12"), for the tiny toy model;
- `word_arith`: short arithmetic word problems as chat-message prompts with answers in
  GSM8K's format ("#### 37"), scored by the GSM8K scorer: a task a small real chat
  model (SmolLM2-135M-Instruct, `hybridflow model smollm2`) can learn on a CPU.

Bad arguments are argparse errors (exit 2) naming the option."""
from __future__ import annotations

import argparse
import os
import sys

from hybridflow.core.data import DataError, toy_rows, word_arith_rows, write_rows
from hybridflow.core.printable import echo

__all__ = ["add_parser", "run"]

_DEFAULT_OUT = {"toy": "data/toy", "word_arith": "data/word_arith"}


def _at_least(low: int, why: str):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"{value} is too small: {why}")
        return value
    return parse


def _fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0.0 < value < 1.0:
        raise argparse.ArgumentTypeError(f"{value} is not between 0 and 1 (both excluded)")
    return value


def add_parser(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser("data", help="generate datasets")
    parser.add_argument("task", choices=("toy", "word_arith"), help="which dataset")
    parser.add_argument("--out", default=None, help="output directory (default data/TASK)")
    parser.add_argument("--format", choices=("jsonl", "parquet"), default="jsonl")
    parser.add_argument("--seed", type=int, default=1)
    toy = parser.add_argument_group("toy")
    toy.add_argument("--max-operand", default=9, type=_at_least(
        1, "the largest operand must be at least 1, so that a pair can be held out"))
    toy.add_argument("--test-fraction", type=_fraction, default=0.25)
    words = parser.add_argument_group("word_arith")
    words.add_argument("--n-train", default=2000, type=_at_least(1, "need a training row"))
    words.add_argument("--n-test", default=100, type=_at_least(1, "need a held-out row"))
    words.add_argument("--max-number", default=20, type=_at_least(
        3, "the largest number in a problem must be at least 3"))
    return parser


def _rows(args):
    if args.task == "toy":
        return toy_rows(args.seed, args.max_operand, args.test_fraction)
    return word_arith_rows(args.seed, args.n_train, args.n_test, args.max_number)


def run(args) -> int:
    out = args.out or _DEFAULT_OUT[args.task]
    if os.path.exists(out) and not os.path.isdir(out):
        echo(f"hybridflow data: --out {out!r} is a file; give a directory (it is "
              f"created if missing)", file=sys.stderr)
        return 1
    try:
        train, test = _rows(args)
    except DataError as err:
        echo(f"hybridflow data: {err}", file=sys.stderr)
        return 1
    for name, rows in (("train", train), ("test", test)):
        path = os.path.join(out, f"{name}.{args.format}")
        write_rows(rows, path)
        echo(f"wrote {len(rows)} rows to {path}")
    return 0
