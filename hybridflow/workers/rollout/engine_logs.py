"""What an inference engine's log says, said once: vLLM logs the same warnings at every
weight update and every engine call (a 40-step run printed ~5,000 lines, among them
`RotaryEmbedding: Failed to load weights` for each layer at each reload), which buries
the lines that matter.

`quiet_engine_logs("vllm")` puts `RepeatFilter` on the handlers of the engine's
logger (vLLM gives its logger its own handler and does not propagate, so a filter on a
handler is what sees the records of its child loggers). The filter:

- replaces a message hybridflow expects (`EXPECTED`) by one line saying why it is
  expected, the first time, and drops its repeats;
- lets any other message through the first time and drops its repeats (messages
  that differ only in numbers are one message), counting them in `dropped`;
- makes every message printable (hybridflow/core/printable.py): an engine's log
  quotes model output and paths.

State: each filter's `seen` (message shapes already shown) and `dropped` (counts of
repeats dropped, by shape). Unrun here against a real vLLM (not installed on this
machine); tests/workers/test_engine_logs.py drives the filter with log records.
"""
from __future__ import annotations

import logging
import re
from collections import Counter

from hybridflow.core.printable import printable

__all__ = ["EXPECTED", "RepeatFilter", "quiet_engine_logs"]

# (pattern of the message, why hybridflow expects it): said once, never repeated
EXPECTED = (
    (re.compile(r"Failed to load weights"),
     "expected at each weight update: layers with no weights of their own (the rotary "
     "embedding's cos/sin cache) have nothing to reload"),
    (re.compile(r"[Ss]leep mode|is not supported on (this|the) (platform|device|CPU)"),
     "expected on a CPU build: the feature is off and generation goes on without it"),
)
_NUMBERS = re.compile(r"\d+(\.\d+)?")


def _shape(message: str) -> str:
    return _NUMBERS.sub("#", message)


class RepeatFilter(logging.Filter):
    """Each message shape once; expected messages as one line that says why."""

    def __init__(self, engine: str):
        super().__init__()
        self.engine = engine
        self.seen: set[str] = set()
        self.dropped: Counter = Counter()

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        why = next((text for pattern, text in EXPECTED if pattern.search(message)), None)
        shape = why or _shape(message)
        if shape in self.seen:
            self.dropped[shape] += 1
            return False
        self.seen.add(shape)
        if why is not None:
            message = f"{message.strip()} -- {why} (said once; its repeats are hidden)"
        record.msg, record.args = printable(message), None
        return True


def quiet_engine_logs(logger_name: str = "vllm") -> RepeatFilter | None:
    """Put one RepeatFilter on every handler of `logger_name` and its root handlers
    (once); returns it, or None when the logger has no handler yet."""
    logger = logging.getLogger(logger_name)
    handlers = list(logger.handlers) or (list(logging.getLogger().handlers)
                                         if logger.propagate else [])
    if not handlers:
        return None
    for handler in handlers:
        found = [f for f in handler.filters if isinstance(f, RepeatFilter)]
        if found:
            return found[0]
    shared = RepeatFilter(logger_name)
    for handler in handlers:
        handler.addFilter(shared)
    return shared
