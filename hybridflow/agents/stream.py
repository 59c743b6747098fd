"""The agent role's streaming calls (`trainer.async_mode=streaming` over agent
episodes: the `StreamingRole` protocol of graph/streams.py), called by the run
scheduler's stream source (runtime/run_long/stream_source.py) as it calls the
rollout role's (workers/rollout/stream_worker.py); take, keep, `stream_start` (none:
polls are inline) and the reply's shape are every streaming role's
(workers/rollout/stream_role.py).

Episodes stream **whole**: `stream_submit(batch, **options)` queues the prompts the
driver sent this rank (a group stays on one rank), n episodes each; `stream_poll()`
plays the next `rollout.micro_batch_size` queued episodes (at least one group) to
their end with the actor's current weights, refreshed first as `agent.play` does.
Their rows stay here (`workers/rollout/stream_store.StreamStore`, as the rollout
role's do) until the train side takes them (`stream_take`); the poll reports the
groups that became whole, with their numbers. An episode never spans a weight update, so
each one is sampled by one version: `token_versions` holds it on the response tokens
(-1 on padding) and `rollout.partial` has nothing to continue or restart. Polls are
inline: the agent role lives in the actor's process (`served_by`), so the scheduler
polls it between train passes, on both runtimes.

Rows of different polls must concatenate, so prompts are laid out
`data.max_prompt_length` wide (responses `agent.max_response_tokens`, as `play`); a
first observation longer than that stops the run naming the key.

State (per worker): the queue of episodes submitted and not played (one-row prompt
batches, in submission order), the store of finished rows, the sampling options of
the last submission, the counters (`episodes`, `polls`: `async/stream/*`).
"""
from __future__ import annotations

from collections import deque

from hybridflow.core.batch import Batch
from hybridflow.core.columns import TOKEN_VERSIONS, uniform_token_versions
from hybridflow.workers.rollout.generation import sampling_options
from hybridflow.workers.rollout.stream_role import StreamRoleCalls, poll_reply
from hybridflow.workers.rollout.stream_store import StreamStore

__all__ = ["AgentStreamCalls", "TOKEN_VERSIONS"]


class AgentStreamCalls(StreamRoleCalls):
    """Mixed into AgentRolloutWorker: needs `rollout_cfg`, `agent_cfg`,
    `prompt_width`, `_host()` and `_episodes()` (what `agent.play` runs too)."""

    def _stream_state(self):
        if getattr(self, "_queue", None) is None:
            self._queue, self._opts, self._store = deque(), None, StreamStore()
            self._counts = {"episodes": 0, "polls": 0}
        return self._queue

    def _held_store(self) -> StreamStore:
        self._stream_state()
        return self._store

    def stream_submit(self, batch: Batch, **options) -> dict:
        """Queue this rank's prompts, n episodes each; {uid: episodes queued}."""
        queue = self._stream_state()
        self._opts = sampling_options(self.rollout_cfg, **options,
                                      max_new_tokens=self.agent_cfg.max_turn_tokens)
        if not len(batch):
            return {}
        rows = batch.repeat(self._opts.n, interleave=True)
        queue.extend(rows.take([i]) for i in range(len(rows)))
        return self._expect(batch, self._opts.n)

    def stream_poll(self, wait_s: float = 0.0, want: int = 1) -> dict:
        """{"groups": {uid: GroupStats tuple} of the groups this poll's episodes made
        whole, "busy": episodes queued, "rows": episodes played, "counts": the
        counters}. Inline: `wait_s` and `want` are not needed (the poll plays)."""
        queue = self._stream_state()
        if not queue:
            return poll_reply({}, False, 0, dict(self._counts))
        take = max(int(self.rollout_cfg.micro_batch_size), self._opts.n)
        chunk = Batch.concat([queue.popleft() for _ in range(min(take, len(queue)))])
        rows = self._play(chunk)
        self._store.add(rows)
        self._counts["episodes"] += len(rows)
        self._counts["polls"] += 1
        return poll_reply(self._store.report(), bool(queue), len(rows), dict(self._counts))

    def _play(self, chunk: Batch) -> Batch:
        """The chunk's episodes (one each), laid out `prompt_width` wide, stamped with
        the one version that played them."""
        out = self._episodes(chunk, self._opts, 1, self.prompt_width)
        host = self._host()
        width = out["prompts"].shape[1]
        if width > self.prompt_width:
            raise RuntimeError(
                f"agent streaming lays episode prompts out data.max_prompt_length="
                f"{self.prompt_width} tokens wide (rows of different polls are trained "
                f"together), but an environment's first observation took {width}; raise "
                f"data.max_prompt_length or set trainer.async_mode=pipeline")
        out.meta = {}  # the agent/* metrics of one poll are not the step's
        out[TOKEN_VERSIONS] = uniform_token_versions(out["response_mask"], host.policy_version)
        return out

    def stream_abort(self) -> int:
        """Drop the episodes not played; how many."""
        queue = self._stream_state()
        dropped = len(queue)
        queue.clear()
        self._store.clear()
        return dropped
