"""Multi-turn agent rollouts: environments and tools in the loop, trajectories kept
as token ids with a loss mask, and a runner that plays a batch of episodes
concurrently. See docs/agents.md.

    env.py              the Environment protocol, StepResult, ToolError
    tools.py            the single-tool shorthand: Tool, ToolEnvironment
    loader.py           'file.py:Name' -> environment factory, checked before launch
    chat_format.py      text -> token ids, once (plain, or a HF chat template)
    trajectory.py       Trajectory (ids, loss_mask, log-probs) and the batch layout
    episodes.py         Episode, its statuses, RolloutResult (batch, metrics)
    runner.py           EpisodeRunner: the concurrent generate/step loop
    engine_generator.py a rollout engine as the runner's generator
    batch_rollout.py    prompt batch -> rollout batch: the agent node's body
    config.py           the `agent` config section and its pre-flight check
    worker.py           AgentRolloutWorker: the `agent` role, its node `agent.play`

May import `core/`, `graph/` and `workers/` (the agent role plays its episodes with the
actor's rollout engine and tokenizer); never `plan/`, `runtime/` or anything above.
"""
from hybridflow.agents.batch_rollout import AGENT_ROLLOUT_WRITES, episode_rows, play_batch
from hybridflow.agents.chat_format import ChatTemplateFormat, PlainFormat, make_chat_format
from hybridflow.agents.env import Environment, ModelTurn, StepResult, ToolError
from hybridflow.agents.episodes import EnvironmentFailedError, Episode, RolloutResult
from hybridflow.agents.loader import (EnvironmentSpecError, check_environment,
                                      load_environment_factory)
from hybridflow.agents.runner import EpisodeRunner, GeneratedTurn, RunnerOptions
from hybridflow.agents.tools import Tool, ToolEnvironment
from hybridflow.agents.trajectory import Trajectory, layout_batch

__all__ = ["Environment", "ModelTurn", "StepResult", "ToolError", "Tool", "ToolEnvironment",
           "PlainFormat", "ChatTemplateFormat", "make_chat_format", "Trajectory",
           "layout_batch", "Episode", "RolloutResult", "EnvironmentFailedError",
           "EpisodeRunner", "RunnerOptions", "GeneratedTurn", "EnvironmentSpecError",
           "check_environment", "load_environment_factory", "play_batch", "episode_rows",
           "AGENT_ROLLOUT_WRITES"]
