"""AgentRolloutWorker: the agent rollout as a node of the graph, `agent.play`.

Bind it as a role of its own, named `agent` (its section, typed by `AgentConfig`,
is read under that name):

    workers.agent=hybridflow.agents.worker:AgentRolloutWorker  agent.env=my_env.py:Env

    episodes = g.call("agent.play", g.source("prompts"), n=cfg.rollout.n)

It lives beside the actor (`served_by` folds it onto the actor's pool and process)
and generates with the actor's engine, refreshed to the actor's weights first as
`actor.generate` does; an agent role on a pool of its own (with a weight-sync edge)
is not supported yet. Each call plays `n` episodes per prompt row through the
`EpisodeRunner` and returns the rollout columns of `AGENT_ROLLOUT_WRITES` with the
prompt's columns forwarded and the `agent/*` metrics. With
`trainer.async_mode=streaming` it streams whole episodes instead (stream.py: the
stream's protocol, graph/streams.py `StreamingRole`).

`hybridflow check` (pre-flight) loads and builds the environment through
`check_section`, so a missing or broken one is reported with the `agent.env` key
before any worker starts.

State: the environment factory, the tokenizer and the chat format, built at start.
"""
from __future__ import annotations

from hybridflow.agents.batch_rollout import AGENT_ROLLOUT_WRITES, play_batch
from hybridflow.agents.chat_format import make_chat_format
from hybridflow.agents.config import AgentConfig, check_agent_section
from hybridflow.agents.engine_generator import EngineGenerator
from hybridflow.agents.loader import load_environment_factory
from hybridflow.agents.runner import EpisodeRunner
from hybridflow.agents.stream import AgentStreamCalls
from hybridflow.core.batch import Batch
from hybridflow.graph.dispatch import DP, method
from hybridflow.graph.streams import Streams
from hybridflow.workers.base import Worker
from hybridflow.workers.config import ModelConfig, RolloutConfig, read_section
from hybridflow.workers.rollout.generation import sampling_options
from hybridflow.workers.rollout.weights import refresh_engine
from hybridflow.workers.tokenizer import load_tokenizer, tokenizer_spec

__all__ = ["AgentRolloutWorker", "episode_width"]

SECTION = "agent"


class AgentRolloutWorker(AgentStreamCalls, Worker):
    config_schema = AgentConfig
    HOST_ROLE = "actor"
    STREAMS = Streams.EPISODES  # whole episodes per poll (stream.py), on any engine

    @classmethod
    def served_by(cls, cfg) -> str:
        return cls.HOST_ROLE

    @classmethod
    def check_section(cls, section) -> None:
        """Pre-flight (`hybridflow check` too): the environment loads and builds."""
        check_agent_section(section)

    def __init__(self, cfg, ctx=None):
        super().__init__(cfg, ctx)
        self.model_cfg = read_section(cfg, "model", ModelConfig)
        self.rollout_cfg = read_section(cfg, "rollout", RolloutConfig)
        self.agent_cfg = read_section(cfg, SECTION, AgentConfig)
        check_agent_section(self.agent_cfg)
        self.env_factory = load_environment_factory(self.agent_cfg.env)
        self.tokenizer = load_tokenizer(tokenizer_spec(self.model_cfg))
        self.format = make_chat_format(self.tokenizer)
        # streaming (stream.py) lays prompts out this wide, so polls concatenate
        data = cfg.get("data") if isinstance(cfg, dict) else getattr(cfg, "data", None)
        width = data.get("max_prompt_length") if isinstance(data, dict) else \
            getattr(data, "max_prompt_length", None)
        self.prompt_width = int(width or 0)

    def _host(self):
        host = self.ctx.colocated.get(self.HOST_ROLE)
        if host is None or getattr(host, "engine", None) is None:
            raise RuntimeError("the agent role generates with the actor's engine, so it must "
                               "share the actor's pool (leave placement.roles.agent unset)")
        return host

    @method(dispatch=DP, reads=("raw_prompt",), writes=AGENT_ROLLOUT_WRITES, kind="generate",
            overwrites=("input_ids", "attention_mask", "position_ids"), forwards=True)
    def play(self, batch: Batch, n: int | None = None, temperature: float | None = None,
             top_p: float | None = None, top_k: int | None = None,
             do_sample: bool | None = None) -> Batch:
        """n episodes per prompt row (rows repeated interleaved: aabb)."""
        opts = sampling_options(self.rollout_cfg, n=n, temperature=temperature, top_p=top_p,
                                top_k=top_k, do_sample=do_sample,
                                max_new_tokens=self.agent_cfg.max_turn_tokens)
        return self._episodes(batch, opts, opts.n)

    def _episodes(self, batch: Batch, opts, n: int, prompt_width: int = 0) -> Batch:
        """`n` episodes per row with the actor's engine, refreshed to its weights first
        and put to sleep after (training gets the memory, as `actor.generate` does);
        `prompt_width`: lay prompts out this wide (0: the widest). `play` and the
        stream's polls (stream.py) both run episodes here."""
        host = self._host()
        engine = host.engine
        bucket = max(1, int(self.rollout_cfg.weight_bucket_mb * 2**20))
        refresh_engine(engine, host.module, host.policy_version, bucket)
        pad = self.tokenizer.pad_token_id
        runner = EpisodeRunner(self.env_factory, EngineGenerator(engine, opts, pad),
                               self.format, self.agent_cfg.runner_options(),
                               env_name=str(self.agent_cfg.env))
        try:
            return play_batch(runner, batch, pad, n=n, prompt_width=prompt_width,
                              response_width=self.agent_cfg.max_response_tokens,
                              policy_version=host.policy_version)
        finally:
            if not engine.shares_module:
                engine.sleep()


def episode_width(cfg, plan) -> int | None:
    """The response width of the plan's agent rollouts (`agent.max_response_tokens`,
    the widest), or None without one: the memory model and the planner lay an agent
    batch out this wide, not `rollout.max_new_tokens` (one turn's budget)."""
    from hybridflow.core.sections import read_section
    agents = [r for r in plan.roles if isinstance(plan.bindings.get(r), type)
              and issubclass(plan.bindings[r], AgentRolloutWorker)]
    if not agents:
        return None
    return max(read_section(cfg, r, AgentConfig).max_response_tokens for r in agents)
