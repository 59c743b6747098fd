"""Running the CLI in the test process for the sweeps of the commands: the exit code
and stderr of `hybridflow.cli.main(argv)`, under an alarm (a FIFO opened by mistake
would block), and stderr's message lines without progress bars."""
from __future__ import annotations

import signal

from hybridflow.cli import main


class _Hung(Exception):
    pass


def _alarm(*_):
    raise _Hung("the command blocked (a FIFO opened?)")


def run_cli(argv, capsys, seconds: int = 60) -> tuple[int, str]:
    previous = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(seconds)
    try:
        code = main([str(a) for a in argv])
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    return code, capsys.readouterr().err


def message_lines(err: str) -> list[str]:
    """stderr without the progress bars and the pointer to error.log a failed run adds."""
    return [line for line in err.splitlines() if line.strip()
            and not line.startswith(("(details:", "Loading weights"))
            and "it/s]" not in line]
