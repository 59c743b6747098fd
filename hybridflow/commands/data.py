"""`hybridflow data toy --out DIR [--format jsonl|parquet]`: write the toy task's
train and test files in verl's schema (what the embedded default trains on).
Bad arguments are argparse errors (exit 2) naming the option."""
from __future__ import annotations

import argparse
import os
import sys

from hybridflow.core.data import toy_rows, write_rows

__all__ = ["add_parser", "run"]


def _operand(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is too small: the largest operand must be "
                                         f"at least 1, so that a pair can be held out")
    return value


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
    parser.add_argument("task", choices=("toy",), help="which dataset")
    parser.add_argument("--out", default="data/toy", help="output directory")
    parser.add_argument("--format", choices=("jsonl", "parquet"), default="jsonl")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--max-operand", type=_operand, default=9)
    parser.add_argument("--test-fraction", type=_fraction, default=0.25)
    return parser


def run(args) -> int:
    if os.path.exists(args.out) and not os.path.isdir(args.out):
        print(f"hybridflow data: --out {args.out!r} is a file; give a directory (it is "
              f"created if missing)", file=sys.stderr)
        return 1
    train, test = toy_rows(args.seed, args.max_operand, args.test_fraction)
    for name, rows in (("train", train), ("test", test)):
        path = os.path.join(args.out, f"{name}.{args.format}")
        write_rows(rows, path)
        print(f"wrote {len(rows)} rows to {path}")
    return 0
