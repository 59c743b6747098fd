"""The tool shorthand: call formats, tool failures as ToolError, and ToolEnvironment's
episode (tool turns get the result back, the final answer is scored)."""
import pytest

from hybridflow.agents import ModelTurn, Tool, ToolEnvironment, ToolError
from hybridflow.agents.tools import FunctionCallFormat, TagCallFormat


def add(expression: str) -> int:
    return sum(int(x) for x in expression.split("+"))


def turn(text: str) -> ModelTurn:
    return ModelTurn(text, (1, 2), 0)


def test_tag_calls_are_found_and_malformed_ones_are_tool_errors():
    fmt = TagCallFormat("calc")
    assert fmt.find("let me see <calc> 12+30 </calc> then").arguments == "12+30"
    assert fmt.find("the answer is 42") is None
    with pytest.raises(ToolError, match="'<calc>' without '</calc>'"):
        fmt.find("<calc>12+30")


def test_function_calls_are_found_and_malformed_ones_are_tool_errors():
    fmt = FunctionCallFormat("calc")
    assert fmt.find("calc(12+30)").arguments == "12+30"
    assert fmt.find("recalc(1)") is None
    with pytest.raises(ToolError, match="'calc\\(' without its closing"):
        fmt.find("calc(12+")


def test_a_tool_that_raises_is_a_tool_error_naming_it():
    tool = Tool("calc", add)
    with pytest.raises(ToolError, match="tool 'calc' failed on '12\\+x': ValueError"):
        tool.run(tool.find_call("<calc>12+x</calc>"))


def test_tool_definitions_are_checked():
    with pytest.raises(ValueError, match="must be an identifier"):
        Tool("my tool", add)
    with pytest.raises(ValueError, match="call_format='json'"):
        Tool("calc", add, call_format="json")
    with pytest.raises(TypeError, match="must be callable"):
        Tool("calc", 3)


def test_a_tool_environment_returns_results_then_scores_the_answer():
    env = ToolEnvironment(Tool("calc", add),
                          score=lambda answer, row: float(answer.strip() == row["ground_truth"]),
                          result_template=" = {result}. ")
    assert env.reset({"raw_prompt": "12+30?", "ground_truth": "42"}) == "12+30?"
    step = env.step(turn("<calc>12+30</calc>"))
    assert (step.observation, step.done, step.tool_calls, step.reward) == (" = 42. ", False, 1, 0)
    assert env.step(turn("42")).reward == 1.0
    assert env.step(turn("41")).done and env.step(turn("41")).reward == 0.0
    with pytest.raises(KeyError, match="column 'raw_prompt'"):
        env.reset({"prompt": "x"})
