"""Issue 32, class 8 (messages that mislead): an engine's repeated warnings are said
once, an expected one with why it is expected (hybridflow/workers/rollout/engine_logs.py).
Driven with log records shaped like vLLM's: a vLLM run is not possible here."""
from __future__ import annotations

import io
import logging

from hybridflow.workers.rollout.engine_logs import RepeatFilter, quiet_engine_logs


def _logger(name: str):
    logger = logging.getLogger(name)
    logger.handlers.clear()
    stream = io.StringIO()
    logger.addHandler(logging.StreamHandler(stream))
    logger.propagate = False  # as vLLM configures its logger
    logger.setLevel(logging.INFO)
    return logger, stream


def test_a_40_step_run_of_reload_warnings_is_one_line_saying_why():
    logger, stream = _logger("fake_vllm")
    shared = quiet_engine_logs("fake_vllm")
    layer = logging.getLogger("fake_vllm.model_executor.layers")  # a child logger
    for step in range(40):
        for index in range(30):
            layer.warning("RotaryEmbedding: Failed to load weights for layer %d", index)
        logger.warning("Step %d took %.1f s", step, 0.5)
    lines = stream.getvalue().splitlines()
    assert len(lines) == 2, lines  # one expected warning, one other shape
    assert "expected at each weight update" in lines[0] and "said once" in lines[0]
    assert sum(shared.dropped.values()) == 40 * 30 + 40 - 2
    assert quiet_engine_logs("fake_vllm") is shared  # once per handler


def test_different_messages_each_show_once_and_are_made_printable():
    logger, stream = _logger("fake_engine")
    quiet_engine_logs("fake_engine")
    logger.warning("model said \x1b]0;title\x07")
    logger.warning("a different warning")
    logger.warning("a different warning")
    text = stream.getvalue()
    assert "\x1b" not in text and "\\x1b]0;title" in text
    assert text.count("a different warning") == 1


def test_a_logger_without_handlers_is_left_alone():
    logger = logging.getLogger("fake_no_handlers")
    logger.handlers.clear()
    logger.propagate = False
    assert quiet_engine_logs("fake_no_handlers") is None
    assert isinstance(RepeatFilter("x"), logging.Filter)
