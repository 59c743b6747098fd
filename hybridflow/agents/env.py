"""The environment protocol of an agent rollout: what a user implements in their file.

An environment plays one episode. The runner builds a fresh one per episode (from
the factory the user declares: a class or a function of no arguments), then:

    first = env.reset(row)          # the dataset row -> the first observation (text)
    result = env.step(turn)         # the model's turn -> StepResult, until done

`turn` is a `ModelTurn`: the text the model wrote (special tokens dropped) and the
exact token ids it sampled. `step` returns the observation to append (text; the
runner tokenises it once with the chat format), a reward contribution (the episode's
reward is their sum) and whether the episode is done. Either method may be a plain
function (run in a thread) or `async def`.

Errors, all of which end only the episode at hand (reward 0, a counted metric):
- raising `ToolError` (e.g. a malformed tool call) -> `agent/tool_errors_total`;
- raising anything else, or returning garbage -> `agent/env_errors_total`;
- taking longer than the step timeout -> `agent/env_timeouts_total`.

Stateless module: each environment keeps its own episode state.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

__all__ = ["Environment", "ModelTurn", "StepResult", "ToolError", "EnvironmentOutputError",
           "as_step_result", "as_first_observation"]


class ToolError(Exception):
    """The model's tool call could not be run (malformed call, bad arguments, the tool
    raised): ends the episode with reward 0, counted as `agent/tool_errors_total`."""


class EnvironmentOutputError(TypeError):
    """An environment returned something that is not a valid observation or step."""


@dataclass(frozen=True)
class ModelTurn:
    """One turn the model sampled: `token_ids` exactly as sampled (ending with the
    chat format's stop token), `text` their decoding without special tokens."""
    text: str
    token_ids: tuple[int, ...]
    index: int                    # 0 for the model's first turn


@dataclass
class StepResult:
    """What `Environment.step` returns. `observation` is appended to the trajectory
    unless `done` (then it is ignored and may be None)."""
    observation: str | None = None
    reward: float = 0.0
    done: bool = False
    tool_calls: int = 0           # tool calls this step ran (for `agent/tool_calls/mean`)


@runtime_checkable
class Environment(Protocol):
    def reset(self, row: dict) -> str: ...

    def step(self, turn: ModelTurn) -> StepResult: ...


def as_first_observation(value: Any) -> str:
    """`reset`'s result, checked: a non-empty string."""
    if not isinstance(value, str) or not value:
        raise EnvironmentOutputError(f"reset must return the first observation as a "
                                     f"non-empty string, got {_describe(value)}")
    return value


def as_step_result(value: Any) -> StepResult:
    """`step`'s result, checked: a StepResult or an (observation, reward, done) tuple,
    with a finite reward, a bool `done` and a string observation unless done."""
    if isinstance(value, tuple) and len(value) == 3:
        value = StepResult(*value)
    if not isinstance(value, StepResult):
        raise EnvironmentOutputError(f"step must return a StepResult or an (observation, "
                                     f"reward, done) tuple, got {_describe(value)}")
    if not isinstance(value.done, bool):
        raise EnvironmentOutputError(f"step returned done={_describe(value.done)}; "
                                     "it must be True or False")
    reward = value.reward
    if isinstance(reward, bool) or not isinstance(reward, (int, float)) \
            or not math.isfinite(reward):
        raise EnvironmentOutputError(f"step returned reward={_describe(reward)}; it must "
                                     "be a finite number")
    if not value.done and (not isinstance(value.observation, str) or not value.observation):
        raise EnvironmentOutputError(f"step returned observation="
                                     f"{_describe(value.observation)} with done=False; an "
                                     "episode that goes on needs a non-empty string")
    if not isinstance(value.tool_calls, int) or value.tool_calls < 0:
        raise EnvironmentOutputError(f"step returned tool_calls={_describe(value.tool_calls)}"
                                     "; it must be an int >= 0")
    return value


def _describe(value: Any) -> str:
    text = repr(value)
    return f"{text[:60]}... ({type(value).__name__})" if len(text) > 60 else \
        f"{text} ({type(value).__name__})"
