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

from hybridflow.commands.args import count, number
from hybridflow.core.data import toy_rows, word_arith_rows, write_rows
from hybridflow.core.printable import echo

__all__ = ["add_parser", "run"]

_DEFAULT_OUT = {"toy": "data/toy", "word_arith": "data/word_arith"}


def add_parser(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser("data", help="generate datasets")
    parser.add_argument("task", choices=("toy", "word_arith"), help="which dataset")
    parser.add_argument("--out", default=None, help="output directory (default data/TASK)")
    parser.add_argument("--format", choices=("jsonl", "parquet"), default="jsonl")
    parser.add_argument("--seed", type=count(0, 2 ** 63 - 1, "a seed"), default=1)
    toy = parser.add_argument_group("toy")
    toy.add_argument("--max-operand", default=9, type=count(
        1, 10 ** 6, "a pair must be held out"))  # the task names its own largest
    toy.add_argument("--test-fraction", type=number(0.0, 1.0, open_ends=True), default=0.25)
    words = parser.add_argument_group("word_arith")
    # their largest values depend on each other: the task refuses what it cannot make,
    # naming the largest, before making a row
    words.add_argument("--n-train", default=2000, type=count(1, 10 ** 9, "rows"))
    words.add_argument("--n-test", default=100, type=count(1, 10 ** 9, "rows"))
    words.add_argument("--max-number", default=20, type=count(
        3, 10 ** 6, "the largest number in a problem"))
    return parser


_BAR_ROWS = 100_000  # a progress bar from this many rows on (seconds of work)


def _rows(args, progress):
    if args.task == "toy":
        return toy_rows(args.seed, args.max_operand, args.test_fraction)
    return word_arith_rows(args.seed, args.n_train, args.n_test, args.max_number,
                           progress=progress)


def _bar(total: int, what: str):
    """A progress bar on stderr for long work, drawn only after a second of it (a
    refusal or a small task prints none)."""
    from tqdm import tqdm
    return tqdm(total=total, unit="row", desc=what, disable=total < _BAR_ROWS, delay=1.0,
                leave=False, file=sys.stderr, dynamic_ncols=True)


def run(args) -> int:
    from hybridflow.core.files import check_output
    out = args.out or _DEFAULT_OUT[args.task]
    check_output(out, "--out", "directory")  # before the rows are made
    size = args.n_train + args.n_test if args.task == "word_arith" else 0
    with _bar(size, "making rows") as bar:
        train, test = _rows(args, bar.update)  # a DataError: one line (commands/errors.py)
    for name, rows in (("train", train), ("test", test)):
        path = os.path.join(out, f"{name}.{args.format}")
        with _bar(len(rows), f"writing {path}") as bar:
            write_rows(rows, path, progress=bar.update)
        echo(f"wrote {len(rows)} rows to {path}")
    return 0
