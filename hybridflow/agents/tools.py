"""The tool shorthand: one Python function the model may call, and the environment
that runs it, for the common single-tool task.

    calc = Tool("calc", lambda expr: sum(int(x) for x in expr.split("+")))
    env = ToolEnvironment(calc, score=lambda answer, row: float(answer == row["ground_truth"]))

A model turn that contains a call (`<calc>12+30</calc>` with the default tag format,
`calc(12+30)` with `call_format="function"`) gets the tool's result back as the next
observation; a turn without a call is the final answer, scored by `score`. A call
that does not parse, or a tool that raises, is a `ToolError` (the episode ends with
reward 0, counted as `agent/tool_errors_total`).

State: a `ToolEnvironment` keeps its episode's row; a `Tool` keeps nothing.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable

from hybridflow.agents.env import ModelTurn, StepResult, ToolError

__all__ = ["Tool", "ToolCall", "TagCallFormat", "FunctionCallFormat", "ToolEnvironment"]


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: str


class TagCallFormat:
    """`<name>arguments</name>`; an opening tag without its closing one is malformed."""

    def __init__(self, name: str):
        self.name = name
        self.pattern = re.compile(rf"<{re.escape(name)}>(.*?)</{re.escape(name)}>", re.S)

    def find(self, text: str) -> ToolCall | None:
        match = self.pattern.search(text)
        if match:
            return ToolCall(self.name, match.group(1).strip())
        if f"<{self.name}>" in text:
            raise ToolError(f"malformed call of tool {self.name!r}: '<{self.name}>' without "
                            f"'</{self.name}>' in {text[:80]!r}")
        return None


class FunctionCallFormat:
    """`name(arguments)`, for vocabularies without angle brackets (the toy tokenizer)."""

    def __init__(self, name: str):
        self.name = name
        self.pattern = re.compile(rf"\b{re.escape(name)}\(([^()]*)\)")
        self.opening = re.compile(rf"\b{re.escape(name)}\(")

    def find(self, text: str) -> ToolCall | None:
        match = self.pattern.search(text)
        if match:
            return ToolCall(self.name, match.group(1).strip())
        if self.opening.search(text):
            raise ToolError(f"malformed call of tool {self.name!r}: '{self.name}(' without "
                            f"its closing ')' in {text[:80]!r}")
        return None


_FORMATS = {"tag": TagCallFormat, "function": FunctionCallFormat}


class Tool:
    """A named function of the call's argument string; its result becomes text."""

    def __init__(self, name: str, fn: Callable[[str], Any], call_format: str | Any = "tag"):
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name or ""):
            raise ValueError(f"tool name {name!r} must be an identifier (letters, digits, _)")
        if not callable(fn):
            raise TypeError(f"tool {name!r}: fn must be callable, got {type(fn).__name__}")
        if isinstance(call_format, str):
            if call_format not in _FORMATS:
                raise ValueError(f"tool {name!r}: call_format={call_format!r} is not one of "
                                 f"{sorted(_FORMATS)} (or an object with find(text))")
            call_format = _FORMATS[call_format](name)
        self.name, self.fn, self.call_format = name, fn, call_format

    def find_call(self, text: str) -> ToolCall | None:
        return self.call_format.find(text)

    def run(self, call: ToolCall) -> str:
        """The tool's result as text; anything it raises becomes a ToolError."""
        try:
            return str(self.fn(call.arguments))
        except ToolError:
            raise
        except Exception as err:
            raise ToolError(f"tool {self.name!r} failed on {call.arguments[:60]!r}: "
                            f"{type(err).__name__}: {err}") from err


class ToolEnvironment:
    """One tool, one scored final answer. `score(answer_text, row) -> float`;
    `result_template` wraps the tool's result into the next observation."""

    def __init__(self, tool: Tool, score: Callable[[str, dict], float],
                 prompt_key: str = "raw_prompt", result_template: str = "\n{result}\n"):
        self.tool, self.score = tool, score
        self.prompt_key, self.result_template = prompt_key, result_template
        self.row: dict = {}

    def reset(self, row: dict) -> str:
        if self.prompt_key not in row:
            raise KeyError(f"ToolEnvironment reads the prompt from column "
                           f"{self.prompt_key!r}; the row has {sorted(row)}")
        self.row = row
        return str(row[self.prompt_key])

    def step(self, turn: ModelTurn) -> StepResult:
        call = self.tool.find_call(turn.text)
        if call is None:
            return StepResult(reward=float(self.score(turn.text, self.row)), done=True)
        result = self.tool.run(call)
        return StepResult(observation=self.result_template.format(result=result),
                          tool_calls=1)
