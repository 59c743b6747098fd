"""The concurrent episode runner: generate, step the environments, append, repeat.

For a batch of rows, each episode cycles: the model generates a turn (batched with
every other episode that is ready at that moment), its environment steps on it
(concurrently with other environments and with generation), the observation is
appended, and the episode is ready again, until the environment says done or the
episode runs out of turns or tokens. Episodes waiting on their environment never
hold up those that can generate. `lockstep=True` is the baseline it is measured
against (bench/agent.py): generate only when no environment call is pending, and
start a new group of episodes only when the last one has ended.

The generator is injected: `generate(contexts, max_new_tokens) -> [GeneratedTurn]`,
one turn per context (token ids in, token ids and log-probs out). It runs in a
thread of its own, so the event loop keeps serving environments meanwhile;
`EngineGenerator` (engine_generator.py) adapts a rollout engine to it. Environment
calls run in a thread pool (or on the loop, for `async def` ones) with a timeout
each; a thread whose call timed out cannot be stopped and runs on in the background.

State: per `run`, the episodes (see episodes.py) and the scheduler's queues, all in
`_Schedule`; the runner object itself holds only its configuration.
"""
from __future__ import annotations

import asyncio
import functools
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable

from hybridflow.agents.bounded import bounded_call, max_token_chars
from hybridflow.agents.chat_format import ChatFormat
from hybridflow.core.origin import contain
from hybridflow.agents.env import ModelTurn, ToolError, as_first_observation, as_step_result
from hybridflow.agents.episodes import EnvironmentFailedError, Episode, RolloutResult
from hybridflow.agents.trajectory import Trajectory

__all__ = ["EpisodeRunner", "RunnerOptions", "GeneratedTurn", "Generator"]


@dataclass
class GeneratedTurn:
    token_ids: list[int]
    log_probs: list[float] | None = None


Generator = Callable[[list[list[int]], int], list[GeneratedTurn]]


@dataclass
class RunnerOptions:
    max_turns: int = 4                # model turns per episode
    max_response_tokens: int = 256    # token budget: model and observation tokens after the prompt
    max_turn_tokens: int = 64         # new tokens per model turn
    step_timeout_s: float = 30.0      # per environment call (reset or step)
    max_active: int = 0               # episodes in flight at once; 0 = the whole batch
    max_batch_rows: int = 0           # rows per generate call; 0 = every ready episode
    env_threads: int = 32             # threads for plain (non-async) environment calls
    lockstep: bool = False            # the turn-by-turn baseline (see the module docstring)
    # generate only once no environment call is in flight, the ready episodes in index
    # order: the groups sampled together (and so the sampling RNG's draws) do not
    # depend on thread timing, and a seed reproduces the episodes (issue 26)
    deterministic: bool = False

    def __post_init__(self):
        for name in ("max_turns", "max_response_tokens", "max_turn_tokens", "env_threads"):
            if getattr(self, name) < 1:
                raise ValueError(f"agent runner option {name} must be >= 1, "
                                 f"got {getattr(self, name)}")
        if self.step_timeout_s <= 0:
            raise ValueError(f"agent runner option step_timeout_s must be > 0, "
                             f"got {self.step_timeout_s}")


@dataclass
class _Schedule:
    waiting: deque                    # episodes not started yet
    ready: deque = field(default_factory=deque)   # episodes whose next move is to generate
    env_calls: set = field(default_factory=set)   # asyncio tasks of environment calls
    generating: Any = None            # the asyncio task of the generate call in flight
    active: int = 0                   # started and not finished
    env_slots: Any = None             # asyncio.Semaphore: plain calls in flight at once
    gen_pool: Any = None              # the generator's own thread


class EpisodeRunner:
    def __init__(self, env_factory: Callable[[], Any], generate: Generator,
                 chat_format: ChatFormat, options: RunnerOptions | None = None,
                 env_name: str = "environment"):
        self.env_factory, self.generate = env_factory, generate
        self.format, self.options, self.env_name = chat_format, options or RunnerOptions(), \
            env_name

    def run(self, rows: list[dict]) -> RolloutResult:
        """Play one episode per row; never raises for one episode's failure."""
        return asyncio.run(self.arun(rows))

    async def arun(self, rows: list[dict]) -> RolloutResult:
        result = RolloutResult([Episode(i, dict(row)) for i, row in enumerate(rows)])
        s = _Schedule(deque(result.episodes),
                      env_slots=asyncio.Semaphore(self.options.env_threads),
                      gen_pool=ThreadPoolExecutor(1, "agent-generate"))
        try:
            await self._drive(s, result)
        finally:  # a timed-out environment call runs on in its daemon thread (bounded.py)
            s.gen_pool.shutdown(wait=False)
        result.compute_metrics()
        self._check_not_all_failed(result)
        return result

    # --------------------------------------------------------------- schedule
    async def _drive(self, s: _Schedule, result: RolloutResult) -> None:
        self._admit(s)
        while s.active:
            waits = self.options.lockstep or self.options.deterministic
            if s.generating is None and s.ready and not (waits and s.env_calls):
                group = self._take_ready(s)
                s.generating = asyncio.create_task(self._generate(s, group))
                result.generate_calls += 1
                result.generated_rows += len(group)
            pending = s.env_calls | ({s.generating} if s.generating else set())
            done, _ = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                if task is s.generating:
                    s.generating = None
                    for episode, turn, limit in task.result():
                        self._after_turn(s, episode, turn, limit)
                else:
                    s.env_calls.discard(task)
                    self._after_env_call(s, *task.result())
            self._admit(s)

    def _admit(self, s: _Schedule) -> None:
        limit = self.options.max_active or len(s.waiting) + s.active
        if self.options.lockstep and s.active:
            return
        while s.waiting and s.active < limit:
            episode = s.waiting.popleft()
            s.active += 1
            try:
                episode.env = self.env_factory()
            except BaseException as err:  # noqa: BLE001 - the user's code: ends this episode
                self._end(s, episode, "env_error", f"building it raised {_name(contain(err))}")
                continue
            missing = [m for m in ("reset", "step") if not callable(getattr(episode.env, m,
                                                                            None))]
            if missing:
                self._end(s, episode, "env_error", f"it built a {type(episode.env).__name__} "
                          f"without {' and '.join(missing)}")
                continue
            self._call_env(s, episode, "reset", episode.env.reset, episode.row)

    def _take_ready(self, s: _Schedule) -> list[Episode]:
        if self.options.deterministic:  # not the order the environment calls finished in
            s.ready = deque(sorted(s.ready, key=lambda e: e.index))
        size = self.options.max_batch_rows or len(s.ready)
        return [s.ready.popleft() for _ in range(min(size, len(s.ready)))]

    def _end(self, s: _Schedule, episode: Episode, status: str, error: str | None = None):
        episode.finish(status, error)
        s.active -= 1

    # ------------------------------------------------------------- generation
    async def _generate(self, s: _Schedule, group: list[Episode]):
        budget, per_turn = self.options.max_response_tokens, self.options.max_turn_tokens
        limits = [min(per_turn, budget - len(e.trajectory)) for e in group]
        contexts = [e.trajectory.context_ids() for e in group]
        loop = asyncio.get_running_loop()
        turns = await loop.run_in_executor(s.gen_pool, self.generate, contexts, max(limits))
        if not isinstance(turns, (list, tuple)) or len(turns) != len(group):
            raise TypeError(f"the generator returned {type(turns).__name__} of "
                            f"{len(turns) if hasattr(turns, '__len__') else '?'} turns for "
                            f"{len(group)} contexts; it must return one GeneratedTurn each")
        return list(zip(group, turns, limits))

    def _after_turn(self, s: _Schedule, episode: Episode, turn: GeneratedTurn, limit: int):
        ids, log_probs = _cut_turn(turn, self.format.stop_ids, limit)
        traj = episode.trajectory
        traj.add_model_turn(ids, log_probs)
        if not ids or ids[-1] not in self.format.stop_ids:
            self._end(s, episode, "truncated", f"model turn {traj.model_turns} hit its "
                      f"{limit}-token limit before a stop token")
            return
        model_turn = ModelTurn(self.format.decode(ids), tuple(ids), traj.model_turns - 1)
        self._call_env(s, episode, "step", episode.env.step, model_turn)

    # ------------------------------------------------------------ environment
    def _call_env(self, s: _Schedule, episode: Episode, what: str, fn, arg) -> None:
        s.env_calls.add(asyncio.create_task(self._timed_call(s, episode, what, fn, arg)))

    async def _timed_call(self, s: _Schedule, episode: Episode, what: str, fn, arg):
        """(episode, what, value, failure): failure is (status, message) or None. The
        call, the check of its result and the tokenization of its observation are
        bounded together by step_timeout_s, off the event loop (bounded.py)."""
        after = self._after_reset if what == "reset" else \
            functools.partial(self._after_step_value, episode)
        try:
            async with s.env_slots:
                value = await bounded_call(fn, arg, after, self.options.step_timeout_s,
                                           f"{self.env_name}.{what}()")
            return episode, what, value, None
        except asyncio.TimeoutError:
            return episode, what, None, ("env_timeout", f"{what} took longer than "
                                         f"{self.options.step_timeout_s:g}s")
        except _Ended as ended:
            return episode, what, None, ended.args
        except ToolError as err:
            return episode, what, None, ("tool_error", str(err))
        except Exception as err:  # noqa: BLE001 - the user's code: ends this episode
            return episode, what, None, ("env_error", f"{what} raised {_name(err)}")

    def _after_reset(self, value) -> list[int]:
        """In the call's thread: the first observation, checked and tokenized."""
        first = as_first_observation(value)
        self._fits(first, self.options.max_response_tokens, "the first observation")
        try:
            return self.format.prompt_ids(first)
        except Exception as err:  # noqa: BLE001 - the environment's text: ends this episode
            raise _Ended("env_error", f"formatting the first observation raised "
                                      f"{_name(err)}") from None

    def _after_step_value(self, episode: Episode, value):
        """In the call's thread: (step, observation ids or None when the episode ends)."""
        step, traj = as_step_result(value), episode.trajectory
        if step.done or traj.model_turns >= self.options.max_turns:
            return step, None
        room = self.options.max_response_tokens - len(traj)
        self._fits(step.observation, room, "the observation")
        try:
            ids = self.format.observation_ids(step.observation)
        except Exception as err:  # noqa: BLE001 - the environment's text: ends this episode
            raise _Ended("env_error", f"formatting an observation raised {_name(err)}") \
                from None
        return step, ids

    def _fits(self, text: str, room: int, what: str) -> None:
        """Refuse, untokenized, a text too long to fit in `room` tokens however it is
        tokenized (a 5 MB observation used to take minutes on the event loop)."""
        if isinstance(text, str) and len(text) > max(room, 1) * max_token_chars(self.format):
            raise _Ended("truncated", f"{what} of {len(text):,} characters cannot fit in "
                                      f"the {room} tokens left of max_response_tokens="
                                      f"{self.options.max_response_tokens}")

    def _after_env_call(self, s: _Schedule, episode: Episode, what: str, value, failure):
        if failure is not None:
            self._end(s, episode, *failure)
        elif what == "reset":
            episode.trajectory = Trajectory(value)
            s.ready.append(episode)
        else:
            self._after_step(s, episode, *value)

    def _after_step(self, s: _Schedule, episode: Episode, step, ids) -> None:
        episode.reward += float(step.reward)
        episode.tool_calls += step.tool_calls
        traj = episode.trajectory
        if step.done:
            self._end(s, episode, "done")
            return
        if traj.model_turns >= self.options.max_turns:
            self._end(s, episode, "truncated", f"not done after max_turns="
                      f"{self.options.max_turns}")
            return
        if len(traj) + len(ids) >= self.options.max_response_tokens:
            self._end(s, episode, "truncated", f"the observation would leave no room in "
                      f"max_response_tokens={self.options.max_response_tokens}")
            return
        traj.add_observation(ids)
        s.ready.append(episode)

    def _check_not_all_failed(self, result: RolloutResult) -> None:
        failed = [e for e in result.episodes if e.status in ("env_error", "env_timeout")]
        if result.episodes and len(failed) == len(result.episodes):
            first = failed[0]
            raise EnvironmentFailedError(
                f"environment {self.env_name!r} failed on every one of the "
                f"{len(failed)} episodes of this batch "
                f"({sum(e.status == 'env_error' for e in failed)} errors, "
                f"{sum(e.status == 'env_timeout' for e in failed)} timeouts); first, "
                f"episode {first.index}: {first.error}. Fix the environment (or raise "
                f"the step timeout if it is only slow)")


class _Ended(Exception):
    """Raised in an environment call's thread: the episode ends with (status, message)."""


def _cut_turn(turn: GeneratedTurn, stop_ids: frozenset, limit: int):
    """The turn through its first stop token and at most `limit` tokens."""
    ids = [int(t) for t in turn.token_ids]
    end = next((i + 1 for i, t in enumerate(ids) if t in stop_ids), len(ids))
    end = min(end, limit)
    log_probs = None if turn.log_probs is None else [float(x) for x in turn.log_probs]
    if log_probs is not None and len(log_probs) != len(ids):
        raise ValueError(f"the generator returned {len(ids)} tokens with {len(log_probs)} "
                         "log-probs; it must return one log-prob per token")
    return ids[:end], (log_probs[:end] if log_probs is not None else None)


def _name(err: BaseException) -> str:
    text = str(err).splitlines()[0] if str(err) else ""
    return f"{type(err).__name__}: {text}" if text else type(err).__name__
