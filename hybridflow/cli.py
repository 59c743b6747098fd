"""`hybridflow run | check | render | plan | data | model | export | status`: one module per
command in hybridflow/commands/, each with add_parser(subparsers) and run(args) -> exit
code. Errors a user can cause become one line and an exit code here
(commands/errors.py); user code calling sys.exit cannot end the process silently."""
from __future__ import annotations

import argparse
import importlib
import sys

from hybridflow.commands.args import IntermixedParser, SafeParser

__all__ = ["main"]

_COMMANDS = ("run", "check", "render", "plan", "data", "model", "export", "status")


def build_parser() -> tuple[argparse.ArgumentParser, dict]:
    handlers = {}
    parser = SafeParser(
        prog="hybridflow", description="Declarative dataflow graphs for RL post-training.")
    subparsers = parser.add_subparsers(dest="command", required=True,
                                       parser_class=IntermixedParser)
    for name in _COMMANDS:
        try:
            module = importlib.import_module(f"hybridflow.commands.{name}")
        except ImportError as err:  # a command whose optional parts are missing
            subparsers.add_parser(name, help=f"(unavailable: {err})")
            handlers[name] = lambda args, e=err: _unavailable(e)
            continue
        module.add_parser(subparsers)
        handlers[name] = module.run
    return parser, handlers


def _unavailable(err: Exception) -> int:
    from hybridflow.core.printable import echo
    echo(f"hybridflow: this command is unavailable: {err}", file=sys.stderr)
    return 2


def main(argv: list[str] | None = None) -> int:
    """Run a command; `argv` None: this is the process (the console script,
    `python -m hybridflow`), which then ends even if user code left a thread behind."""
    from hybridflow.core.printable import sanitize_warnings
    sanitize_warnings()  # a warning's text can quote a user's key or file
    parser, handlers = build_parser()
    args = parser.parse_args(argv)  # argparse exits 2 itself on bad arguments
    try:
        code = int(handlers[args.command](args) or 0)
    except BaseException as err:  # noqa: BLE001 - sorted below (a library's BaseException too)
        from hybridflow.commands.errors import report
        code = report(args.command, err)
    if argv is None:
        end_process(code)
    return code


def end_process(code: int, grace_s: float = 2.0) -> None:
    """The one way the process ends once its outcome is reported: a thread that user
    code left running (an environment, a scorer or a function node that never
    returned, past its bound) would keep the interpreter alive at exit, since
    non-daemon threads are joined then. Wait `grace_s` for such threads, then end
    without joining them (`os._exit`, after flushing the output)."""
    import os
    import threading
    import time
    deadline = time.monotonic() + grace_s
    for thread in threading.enumerate():
        if thread is not threading.current_thread() and not thread.daemon:
            thread.join(max(0.0, deadline - time.monotonic()))
    if any(t.is_alive() and not t.daemon and t is not threading.current_thread()
           for t in threading.enumerate()):
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


if __name__ == "__main__":
    sys.exit(main())
