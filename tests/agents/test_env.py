"""What an environment may return: checked, with messages that say what was wrong."""
import pytest

from hybridflow.agents import StepResult
from hybridflow.agents.env import EnvironmentOutputError, as_first_observation, as_step_result


def test_a_step_result_or_a_three_tuple_is_accepted():
    assert as_step_result(("more", 0.5, False)) == StepResult("more", 0.5, False)
    assert as_step_result(StepResult(reward=1, done=True)).done


@pytest.mark.parametrize("value,message", [
    ("text", "must return a StepResult"),
    (StepResult(None, 0.0, False), "needs a non-empty string"),
    (StepResult("x", float("inf"), False), "finite number"),
    (StepResult("x", "1", False), "finite number"),
    (StepResult("x", 0.0, 1), "must be True or False"),
    (StepResult("x", 0.0, False, tool_calls=-1), "int >= 0")])
def test_garbage_steps_are_refused(value, message):
    with pytest.raises(EnvironmentOutputError, match=message):
        as_step_result(value)


def test_the_first_observation_must_be_text():
    assert as_first_observation("hi") == "hi"
    with pytest.raises(EnvironmentOutputError, match="non-empty string"):
        as_first_observation(["hi"])
