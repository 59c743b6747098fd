"""The `agent` config section and its pre-flight check.

The section is the `agent` role's own (its worker class's `config_schema`, see
worker.py): it exists in a run's config when `workers.agent` binds that class, and
pre-flight calls `check_agent_section` through the class's `check_section`.

Stateless.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from hybridflow.agents.loader import EnvironmentSpecError, check_environment
from hybridflow.agents.runner import RunnerOptions
from hybridflow.core.constraints import ConfigError, above, at_least, checked

__all__ = ["AgentConfig", "check_agent_section"]


@dataclass
class AgentConfig:
    env: Optional[str] = None               # "path/to/file.py:Name" or "package.module:Name"
    max_turns: int = checked(4, at_least(1))
    max_response_tokens: int = checked(256, at_least(1))   # budget after the prompt
    max_turn_tokens: int = checked(64, at_least(1))        # new tokens per model turn
    step_timeout_s: float = checked(30.0, above(0))
    max_active: int = checked(0, at_least(0))              # episodes in flight; 0 = all
    max_batch_rows: int = checked(0, at_least(0))          # rows per generate call; 0 = all
    env_threads: int = checked(32, at_least(1))
    # the same seed gives the same episodes: each generate call waits for the
    # environment calls in flight and takes the ready episodes in index order, so what
    # is sampled together does not depend on which thread finished first. false lets
    # generation overlap slow environments (faster; not reproducible)
    deterministic: bool = True

    def runner_options(self) -> RunnerOptions:
        return RunnerOptions(max_turns=self.max_turns,
                             max_response_tokens=self.max_response_tokens,
                             max_turn_tokens=self.max_turn_tokens,
                             step_timeout_s=self.step_timeout_s, max_active=self.max_active,
                             max_batch_rows=self.max_batch_rows, env_threads=self.env_threads,
                             deterministic=self.deterministic)



def check_agent_section(section: AgentConfig) -> None:
    """The environment named by `agent.env` loads and builds (ConfigError otherwise)."""
    if not section.env:
        raise ConfigError("agent.env is not set: name the environment as "
                          "agent.env='path/to/file.py:Name'")
    if section.max_turn_tokens > section.max_response_tokens:
        raise ConfigError(f"agent.max_turn_tokens={section.max_turn_tokens} is more than "
                          f"agent.max_response_tokens={section.max_response_tokens}, the "
                          "budget of the whole episode; lower it or raise the budget")
    try:
        check_environment(section.env, section.step_timeout_s)
    except EnvironmentSpecError as err:
        raise ConfigError(f"agent.env: {err}") from None
