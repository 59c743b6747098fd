"""`hybridflow data toy --out DIR [--format jsonl|parquet]`: write the toy task's
train and test files in verl's schema (what the embedded default trains on)."""
from __future__ import annotations

import argparse
import os

from hybridflow.data import toy_rows, write_rows

__all__ = ["add_parser", "run"]


def add_parser(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser("data", help="generate datasets")
    parser.add_argument("task", choices=("toy",), help="which dataset")
    parser.add_argument("--out", default="data/toy", help="output directory")
    parser.add_argument("--format", choices=("jsonl", "parquet"), default="jsonl")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--max-operand", type=int, default=9)
    parser.add_argument("--test-fraction", type=float, default=0.25)
    return parser


def run(args) -> int:
    train, test = toy_rows(args.seed, args.max_operand, args.test_fraction)
    for name, rows in (("train", train), ("test", test)):
        path = os.path.join(args.out, f"{name}.{args.format}")
        write_rows(rows, path)
        print(f"wrote {len(rows)} rows to {path}")
    return 0
