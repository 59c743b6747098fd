"""The streaming wing's protocol in one place (issue 38 item 6, graph/streams.py): the
six calls a streaming role answers are declared once (`StreamingRole`), named by
`StreamCall`, and no module of hybridflow/ spells one of their names in a string (a
call by name, an error text): read from the code with docstrings left out, like
tests/test_layout_owner.py. A class that declares `STREAMS` answers every call."""
from __future__ import annotations

import ast
import glob
import os
import re

import pytest

from hybridflow.graph.streams import (StreamCall, StreamingRole, StreamProtocolWarning,
                                      Streams, stream_capability)

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OWNER = "hybridflow/graph/streams.py"
NAMES = re.compile(r"\bstream_(submit|start|poll|take|keep|abort)\b")


def _docstrings(tree: ast.AST) -> set[int]:
    """ids of the docstring constants (prose may name a call)."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                out.add(id(body[0].value))
    return out


def _spelled(path: str) -> list[str]:
    with open(path, encoding="utf-8") as handle:
        tree = ast.parse(handle.read())
    prose = _docstrings(tree)
    return [f"line {node.lineno}: {node.value!r}" for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str)
            and id(node) not in prose and NAMES.search(node.value)]


def test_no_module_spells_a_stream_call_outside_the_protocol():
    found = []
    for path in sorted(glob.glob(os.path.join(REPO, "hybridflow", "**", "*.py"),
                                 recursive=True)):
        rel = os.path.relpath(path, REPO)
        if rel != OWNER:
            found += [f"{rel}: {hit}" for hit in _spelled(path)]
    assert not found, ("name a stream call by hybridflow.graph.streams.StreamCall, not a "
                       "string:\n" + "\n".join(found))


def test_the_sweep_finds_a_spelled_call(tmp_path):
    path = tmp_path / "m.py"
    path.write_text('"""Calls `stream_poll`."""\nx = call("stream_poll")\n'
                    'y = f"{role}.stream_keep: {err}"\nz = "rollout.stream_poll_steps"\n')
    assert [hit.split(":")[0] for hit in _spelled(str(path))] == ["line 2", "line 3"]


def test_the_names_are_the_protocols_methods():
    declared = [name for name in vars(StreamingRole) if name.startswith("stream_")]
    assert sorted(StreamCall.ALL) == sorted(declared)
    assert all(type(name) is str for name in StreamCall.ALL)  # plain strings: hash as such


def test_the_worker_shell_answers_the_calls_a_pass_submits_as_tasks():
    """stream_take.py and the stream client's `keep` submit `StreamCall.TAKE` / `KEEP`
    as the worker shell's task methods, which call the role's."""
    from hybridflow.runtime.worker_shell import FusedWorker
    assert all(callable(getattr(FusedWorker, c)) for c in (StreamCall.TAKE, StreamCall.KEEP))


def test_every_streaming_role_answers_every_call():
    from hybridflow.agents.worker import AgentRolloutWorker
    from hybridflow.workers.rollout.worker import RolloutWorker
    assert stream_capability(RolloutWorker) is Streams.ENGINE
    assert stream_capability(AgentRolloutWorker) is Streams.EPISODES
    assert AgentRolloutWorker.stream_start(object.__new__(AgentRolloutWorker)) is False


class Polls:
    STREAMS = Streams.EPISODES

    def stream_submit(self, batch, **options):
        return {}

    def stream_poll(self, wait_s=0.0, want=1):
        return {}


class Inline(Polls):  # written before the protocol: never started, no entrance pass
    def stream_take(self, uids, leave=False, producer=None):
        return None

    def stream_abort(self):
        return 0


def test_a_class_that_streams_without_every_call_is_refused_naming_them():
    with pytest.raises(TypeError, match=r"Polls.STREAMS = Streams.EPISODES, but Polls lacks "
                                        r"\['stream_take', 'stream_abort'\] of the stream's "
                                        r"calls \(hybridflow.graph.streams.StreamingRole"):
        stream_capability(Polls)


def test_a_role_without_start_or_keep_still_streams_for_a_release_with_a_warning():
    with pytest.warns(StreamProtocolWarning, match=r"Inline lacks \['stream_start', "
                                                   r"'stream_keep'\] .* the next refuses"):
        assert stream_capability(Inline) is Streams.EPISODES
