"""Streaming is declared by an engine's registration, never probed on the object
(hybridflow/workers/rollout/engine.py): `register_engine(..., streams=True)` or a
`streams = True` on a factory named by import path; a declared engine is checked
against every `StreamingEngine` member when built, and an undeclared one is refused
with the line that declares it."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from hybridflow.workers.rollout import engine
from hybridflow.workers.rollout.engine import (STREAMING_MEMBERS, EngineSpec, check_streaming,
                                               engine_streams, make_engine, register_engine,
                                               streaming_engines)


class BatchOnly:
    """A RolloutEngine without the streaming calls."""
    shares_module, policy_version = False, 0

    def __init__(self, spec):
        self.spec = spec

    def generate(self, prompts, opts):
        raise NotImplementedError  # never called here

    def load_weights(self, weights):
        pass

    def finish_weight_update(self, version):
        self.policy_version = version

    def sleep(self):
        pass

    def wake_up(self):
        pass


class Streaming(BatchOnly):
    """BatchOnly plus every StreamingEngine member."""
    tp, stream_busy = 1, False

    def submit(self, prompts, opts):
        return len(prompts)

    def poll(self, max_steps):
        return None

    def abort(self):
        return 0

    def stream_counts(self):
        return {"decode_steps": 0}


@pytest.fixture(autouse=True)
def own_registry(monkeypatch):
    """This test's registrations stay in this test."""
    for name in ("_ENGINES", "_STREAMING", "_TENSOR_PARALLEL"):
        monkeypatch.setattr(engine, name, type(getattr(engine, name))(getattr(engine, name)))


def _spec(backend: str) -> EngineSpec:
    return EngineSpec(None, SimpleNamespace(backend=backend), None, None, torch.device("cpu"))


def test_both_built_in_engines_declare_streaming():
    assert {"hf", "vllm"} <= set(streaming_engines())
    assert engine_streams("hf") and engine_streams("vllm")


def test_a_declared_engine_is_checked_against_the_protocol_when_built():
    register_engine("declared_streaming", Streaming, streams=True)
    built = make_engine(_spec("declared_streaming"))
    check_streaming(built, "declared_streaming")  # no error
    assert built.stream_counts() == {"decode_steps": 0} and built.tp == 1
    register_engine("declared_only", BatchOnly, streams=True)
    with pytest.raises(TypeError, match=r"'declared_only' \(BatchOnly\) is registered with "
                                        r"streams=True but lacks \['submit', 'poll', 'abort', "
                                        r"'stream_busy', 'stream_counts', 'tp'\]"):
        make_engine(_spec("declared_only"))
    assert STREAMING_MEMBERS == ("submit", "poll", "abort", "stream_busy", "stream_counts",
                                 "tp")


def test_an_undeclared_engine_is_refused_even_when_it_has_the_calls():
    register_engine("undeclared", Streaming)  # the calls, but no streams=True
    built = make_engine(_spec("undeclared"))  # a batch engine: built, not checked
    assert not engine_streams("undeclared")
    with pytest.raises(TypeError, match=r"rollout.backend='undeclared' \(Streaming\) does not "
                                        r"declare streaming \(engines that stream: hf, vllm\)"
                                        r".*register_engine\(name, factory, streams=True\)"):
        check_streaming(built, "undeclared")


def test_a_declaration_must_be_a_bool():
    with pytest.raises(TypeError, match=r"register_engine\('odd', ...\): streams must be "
                                        r"True or False, not 'yes'"):
        register_engine("odd", Streaming, streams="yes")


FACTORIES = '''
def declared(spec):
    raise NotImplementedError  # only the declaration is read


declared.streams = True


def undeclared(spec):
    raise NotImplementedError


def misdeclared(spec):
    raise NotImplementedError


misdeclared.streams = "yes"


class EngineClass:
    streams = True
'''


def test_a_factory_named_by_path_declares_streaming_on_itself(tmp_path):
    path = tmp_path / "engines.py"
    path.write_text(FACTORIES)
    assert engine_streams(f"{path}:declared") and engine_streams(f"{path}:EngineClass")
    assert not engine_streams(f"{path}:undeclared")
    with pytest.raises(ValueError, match=r"engines.py:misdeclared'.*`streams` declaration "
                                         r"must be True or False, not 'yes'"):
        engine_streams(f"{path}:misdeclared")
