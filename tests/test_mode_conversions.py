"""The config's mode strings become members in one place (issue 38 item 7): outside
`core/modes.run_modes`, no module of hybridflow/ converts `trainer.async_mode`,
`trainer.stream_side` or `runtime.name` itself (`AsyncMode.of(cfg...)`,
`RuntimeName(cfg.runtime.name)`); it asks `run_modes(cfg)` for the capability. Read
from the code (strings and comments left out), like tests/test_layout_owner.py. The
files still allowed say why, with how many conversions they hold; an allowance no
longer needed fails too, so the list only shrinks."""
from __future__ import annotations

import glob
import io
import os
import re
import tokenize

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CONVERTS = re.compile(r"\b(AsyncMode|RuntimeName|StreamSide)(\.of)?\(")

OWNERS = {"hybridflow/core/modes.py"}
ALLOWED = {
    # the `--runtime` flag, read before it becomes the config's runtime.name
    "hybridflow/commands/args.py": (1, "a command-line flag"),
    # teammates' files, routed to run_modes next
    "hybridflow/program/parallel_checks.py": (4, "parallel checks (teammate's file)"),
    "hybridflow/commands/render.py": (1, "render's streaming axis"),
    "hybridflow/memory/report.py": (1, "the memory report's per-rank pools"),
    # a runtime's own `name` (already a member; a test fake's may be its string)
    "hybridflow/runtime/run_long/stream_source.py": (1, "the stream loop (teammate's file)"),
}


def _code(path: str) -> list[tuple[int, str]]:
    """(line, code) of a file with its strings and comments blanked out."""
    with open(path, encoding="utf-8") as handle:
        source = handle.read()
    lines = source.splitlines()
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type in (tokenize.STRING, tokenize.COMMENT) and tok.start[0] == tok.end[0]:
            row, (a, b) = tok.start[0] - 1, (tok.start[1], tok.end[1])
            fill = "x" * (b - a) if tok.type == tokenize.STRING else ""
            lines[row] = lines[row][:a] + fill + lines[row][b:]
        elif tok.type == tokenize.STRING:  # a multi-line string (a docstring): drop it
            for row in range(tok.start[0] - 1, tok.end[0]):
                lines[row] = ""
    return list(enumerate(lines, 1))


def _conversions() -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for path in sorted(glob.glob(os.path.join(REPO, "hybridflow", "**", "*.py"),
                                 recursive=True)):
        rel = os.path.relpath(path, REPO)
        if rel in OWNERS:
            continue
        for line, code in _code(path):
            if CONVERTS.search(code):
                found.setdefault(rel, []).append(f"{rel}:{line}: {code.strip()}")
    return found


def test_only_run_modes_converts_the_config_to_a_mode_or_runtime():
    found = _conversions()
    wrong = [hit for rel, hits in found.items()
             if len(hits) > ALLOWED.get(rel, (0, ""))[0] for hit in hits]
    assert not wrong, ("ask core/modes.run_modes(cfg) for the run's modes (its "
                       "async_mode, stream_side, runtime and what they can do):\n"
                       + "\n".join(wrong))


def test_every_allowance_is_still_needed():
    found = _conversions()
    stale = sorted(rel for rel, (count, _) in ALLOWED.items()
                   if len(found.get(rel, ())) < count)
    assert not stale, f"lower or remove these allowances, they convert less now: {stale}"


def test_the_check_finds_a_conversion_and_skips_strings_and_capabilities():
    assert CONVERTS.search("AsyncMode.of(cfg.trainer.async_mode).streams")
    assert CONVERTS.search("if RuntimeName(cfg.runtime.name) is RuntimeName.RAY:")
    assert not CONVERTS.search("run_modes(cfg).runtime.process_per_rank")
    assert not CONVERTS.search("RuntimeName.names()") and not CONVERTS.search("AsyncModes(")
