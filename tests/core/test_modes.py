"""Typed run modes (hybridflow/core/modes.py): the config keeps the user's strings and
errors, a string converts to its member once, and each member declares what it can do."""
from __future__ import annotations

import json

import pytest

from hybridflow.core.modes import AsyncMode, RuntimeName
from hybridflow.program.config import ConfigError, build_config


def test_members_are_their_strings():
    assert AsyncMode.STREAMING == "streaming" and f"{RuntimeName.RAY}" == "ray"
    assert json.dumps([AsyncMode.PIPELINE, RuntimeName.LOCAL]) == '["pipeline", "local"]'
    assert AsyncMode.names() == ("pipeline", "streaming")
    assert RuntimeName.names() == ("local", "ray")


@pytest.mark.parametrize("mode", AsyncMode.names())
def test_the_config_accepts_every_async_mode_and_it_converts(mode):
    cfg = build_config(overrides=[f"trainer.async_mode={mode}"])
    assert AsyncMode.of(cfg.trainer.async_mode) is AsyncMode(mode)
    assert type(cfg.trainer.async_mode) is str  # the config holds the user's string


@pytest.mark.parametrize("override, message", [
    ("trainer.async_mode=stream", "trainer.async_mode='stream' is not a known "
     "trainer.async_mode; did you mean 'streaming'? (valid: pipeline, streaming)"),
    ("runtime.name=rey", "runtime.name must be 'local' or 'ray', got 'rey'")])
def test_a_bad_value_keeps_the_config_error_users_know(override, message):
    with pytest.raises(ConfigError) as err:
        build_config(overrides=[override])
    assert str(err.value) == message


def test_of_names_the_allowed_values():
    with pytest.raises(ValueError, match="must be one of pipeline, streaming, not 'sync'"):
        AsyncMode.of("sync")
    assert RuntimeName.of(RuntimeName.RAY) is RuntimeName.RAY


def test_capabilities():
    assert AsyncMode.STREAMING.streams and not AsyncMode.PIPELINE.streams
    # one process per rank: collectives (tp > 1, several trained ranks) and real pools
    assert RuntimeName.RAY.process_per_rank and not RuntimeName.LOCAL.process_per_rank
    assert RuntimeName.RAY.joins_cluster and not RuntimeName.LOCAL.joins_cluster


def test_no_engine_module_compares_a_mode_or_runtime_with_its_string():
    """The class stays fixed: outside core/modes.py and the config's comments, no module
    of hybridflow/ compares `async_mode` or `runtime.name` with a literal."""
    import pathlib
    import re
    root = pathlib.Path(__file__).resolve().parents[2] / "hybridflow"
    compare = re.compile(r"(async_mode|runtime\.name|args\.runtime)[^\n]*[!=]=\s*['\"]"
                         r"|[!=]=\s*['\"](streaming|pipeline|ray|local)['\"]")
    found = [f"{path.relative_to(root)}:{n}" for path in sorted(root.rglob("*.py"))
             for n, line in enumerate(path.read_text().splitlines(), 1)
             if compare.search(line.split("#")[0])]
    assert not found, f"compare with AsyncMode / RuntimeName members instead: {found}"


def test_run_modes_converts_the_config_once_from_any_of_its_forms():
    """`run_modes` reads a checked config, its typed values or a plain dict; an absent
    key takes the schema's default; a bad value names the key."""
    from hybridflow.core.modes import RunModes, StreamSide, run_modes
    from hybridflow.program.config import run_values
    cfg = build_config(overrides=["trainer.async_mode=streaming", "runtime.name=ray",
                                  "trainer.stream_side=generate_only"])
    want = RunModes(AsyncMode.STREAMING, StreamSide.GENERATE_ONLY, RuntimeName.RAY)
    assert run_modes(cfg) == want == run_modes(run_values(cfg))
    assert run_modes({"runtime": {"name": "ray"}}) == RunModes(runtime=RuntimeName.RAY)
    assert run_modes({}) == RunModes() and run_modes(build_config()) == RunModes()
    with pytest.raises(ValueError, match="runtime.name must be one of local, ray, not 'rey'"):
        run_modes({"runtime": {"name": "rey"}})


def test_a_buffer_carries_its_mode():
    from hybridflow.plan.async_split import BufferSpec
    spec = BufferSpec("actor.generate", 1, "uid", 1)
    assert spec.mode is AsyncMode.PIPELINE and not spec.streaming
    assert BufferSpec("actor.generate", 1, "uid", 1, AsyncMode.STREAMING).streaming
