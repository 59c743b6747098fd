"""Text from outside made safe to show: the one place text reaches a console, a progress
bar, a log or a TensorBoard text panel.

A run directory, a model's output, a data row, a config key and the message of a user
function's exception are data: their bytes must not drive the terminal. An escape
sequence can clear the screen, retitle the window, recolour what follows, hide text or
plant an OSC 8 hyperlink; a bidi override reorders what the reader sees. `printable`
shows every such character as its escape (`\\x1b`, `\\x9b`, `\\u202e`), keeping newlines
and tabs; `echo` is `print` through it, and `MISUSED` lists the characters it escapes
(what the tests sweep). Files keep the exact text (JSON escapes it there). Stateless.
"""
from __future__ import annotations

import re
import sys

__all__ = ["printable", "echo", "MISUSED", "sanitize_warnings"]

# C0 except \t and \n, DEL, C1; the bidi embeddings, overrides and isolates (Trojan Source,
# CVE-2021-42574) and the invisible direction marks; the line/paragraph separators, which
# some terminals break on, and the BOM/zero-width no-break space.
_BIDI = "\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"
MISUSED = ("".join(chr(c) for c in range(0x20) if chr(c) not in "\t\n") + "\x7f"
           + "".join(chr(c) for c in range(0x80, 0xa0)) + _BIDI + "\u2028\u2029\ufeff")
_PATTERN = re.compile("[" + re.escape(MISUSED) + "]")


def _escape(match: re.Match) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def printable(text: object) -> str:
    """`text` (any object, through str) with every control character, escape sequence
    introducer and bidi override shown as its escape; newlines and tabs kept."""
    return _PATTERN.sub(_escape, text if isinstance(text, str) else str(text))


def echo(*values: object, sep: str = " ", end: str = "\n", file=None, flush: bool = False
         ) -> None:
    """`print`, with the text made printable first (sys.stdout by default)."""
    stream = sys.stdout if file is None else file
    print(printable(sep.join(str(v) for v in values)), end=end, file=stream, flush=flush)


_ORIGINAL_FORMAT = None


def sanitize_warnings() -> None:
    """Warnings shown on the console (a graph's FutureWarning, a library's) go through
    `printable` too: their message can quote a user's key or file. Idempotent."""
    import warnings
    global _ORIGINAL_FORMAT
    if _ORIGINAL_FORMAT is not None:
        return
    _ORIGINAL_FORMAT = warnings.formatwarning

    def formatwarning(message, category, filename, lineno, line=None):
        return printable(_ORIGINAL_FORMAT(message, category, filename, lineno, line))
    warnings.formatwarning = formatwarning
