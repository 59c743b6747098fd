"""The agent config section: its options reach the runner, and its pre-flight check
names the key when the environment cannot load."""
import pytest

from graphs.envs import calculator
from hybridflow.agents.config import AgentConfig, check_agent_section
from hybridflow.core.constraints import ConfigError, check_values


def test_the_section_becomes_runner_options():
    options = AgentConfig(max_turns=2, max_active=8).runner_options()
    assert (options.max_turns, options.max_active, options.max_turn_tokens) == (2, 8, 64)


def test_preflight_loads_the_environment_or_names_the_key():
    check_agent_section(AgentConfig(env=f"{calculator.__file__}:make_env"))
    with pytest.raises(ConfigError, match="agent.env: environment=.*defines no 'nope'"):
        check_agent_section(AgentConfig(env=f"{calculator.__file__}:nope"))
    with pytest.raises(ConfigError, match="agent.env is not set"):
        check_agent_section(AgentConfig())
    with pytest.raises(ConfigError, match="agent.max_turn_tokens=64 is more than"):
        check_agent_section(AgentConfig(env="x.py:E", max_response_tokens=32))


def test_values_out_of_range_are_refused_by_the_schema_rules():
    with pytest.raises(ConfigError, match="max_turns"):
        check_values(AgentConfig(max_turns=0), "agent")
