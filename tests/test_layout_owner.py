"""One owner for a role's layout (issue 38, DESIGN.md "One owner for a role's layout"):
no module of hybridflow/ derives dp from tp (`world // tp`, `rank % tp`, ...) or probes
a DTensor (`hasattr(t, "to_local")`) itself; they ask `core/layout.RoleLayout` and
`core/dtensor`. Read from the code (strings and comments left out), like the layer
check. The files still allowed say why; an allowance no longer needed fails too, so
the list only shrinks."""
from __future__ import annotations

import glob
import io
import os
import re
import tokenize

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# `x // tp`, `x % self.tp`, `x // placement.tp_size(role)`, `x // layout.tp_size`
DERIVES = re.compile(r"(//|%)\s*(\w+\.)*(tp|tp_size)\b")
PROBES = re.compile(r"hasattr\(\s*\w+\s*,\s*['\"](to_local|full_tensor)['\"]\s*\)")

OWNERS = {"hybridflow/core/layout.py", "hybridflow/core/dtensor.py"}
ALLOWED = {
    # a model's sizes split over tp ranks (heads, vocabulary, parameters per shard):
    # arithmetic on the model, not on the ranks
    "hybridflow/memory/model_size.py": "model sizes per shard",
    # the planner's search enumerates candidate tp sizes against a pool and the heads
    "hybridflow/planner/cost.py": "candidate sizes of the search",
    # the rollout engines' own tp groups: their owners' files, routed next
    "hybridflow/workers/rollout/vllm_group.py": "rollout engine groups (teammate's file)",
    "hybridflow/workers/rollout/stream_worker.py": "rollout stream (teammate's file)",
    "hybridflow/workers/rollout/vllm_checks.py": "vLLM's own head check (teammate's file)",
    "hybridflow/workers/rollout/hf.py": "hf engine's weight bytes (teammate's file)",
}


def _code(path: str) -> list[tuple[int, str]]:
    """(line, code) of a file with its strings and comments blanked out."""
    with open(path, encoding="utf-8") as handle:
        source = handle.read()
    lines = source.splitlines()
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type in (tokenize.STRING, tokenize.COMMENT) and tok.start[0] == tok.end[0]:
            row, (a, b) = tok.start[0] - 1, (tok.start[1], tok.end[1])
            text = "x" * (b - a) if tok.type == tokenize.STRING else ""
            if tok.type == tokenize.STRING and PROBES.search(lines[row]):
                text = lines[row][a:b]  # keep the attribute name hasattr() asks for
            lines[row] = lines[row][:a] + text + lines[row][b:]
        elif tok.type == tokenize.STRING:  # a multi-line string (a docstring): drop it
            for row in range(tok.start[0] - 1, tok.end[0]):
                lines[row] = ""
    return list(enumerate(lines, 1))


def _offenders() -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for path in sorted(glob.glob(os.path.join(REPO, "hybridflow", "**", "*.py"),
                                 recursive=True)):
        rel = os.path.relpath(path, REPO)
        if rel in OWNERS:
            continue
        for line, code in _code(path):
            if DERIVES.search(code) or PROBES.search(code):
                found.setdefault(rel, []).append(f"{rel}:{line}: {code.strip()}")
    return found


def test_only_the_layout_derives_dp_from_tp_and_only_core_dtensor_probes_dtensors():
    found = _offenders()
    wrong = [hit for rel, hits in found.items() if rel not in ALLOWED for hit in hits]
    assert not wrong, ("derive a role's layout with core/layout.RoleLayout (placement."
                       "layout(role), ctx.layout) and ask core/dtensor for DTensors:\n"
                       + "\n".join(wrong))


def test_every_allowance_is_still_needed():
    stale = sorted(set(ALLOWED) - set(_offenders()))
    assert not stale, f"remove these from ALLOWED, they no longer derive a layout: {stale}"


def test_the_check_finds_a_derivation_and_a_probe():
    assert DERIVES.search("dp = world // tp") and DERIVES.search("r % self.tp")
    assert DERIVES.search("n // placement.tp_size(role)")
    assert PROBES.search('x.to_local() if hasattr(x, "to_local") else x')
    assert not DERIVES.search("n // top") and not DERIVES.search("n // tpx")
