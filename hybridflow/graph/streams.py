"""What a worker class declares about streaming (`trainer.async_mode=streaming`), read
by the compiler (plan/streaming_split.py) as it reads `@method` declarations: a role
that streams says so, and how; nothing probes it for the calls a scheduler makes.

`STREAMS`, a class attribute holding a `Streams` (absent or None: the role cannot
stream its generate node):

- `Streams.ENGINE`: request by request through the role's rollout engine (submit /
  poll / abort while weights change, responses continued or restarted), so the
  engine named by `rollout.backend` must declare streaming
  (`register_engine(..., streams=True)`). The `rollout` role.
- `Streams.EPISODES`: whole episodes per poll with the engine's plain `generate`,
  each episode sampled by one weights version, on any engine. The `agent` role.

Either way its generate method writes the stream's columns (`STREAM_COLUMNS` of
core/columns.py: the versions the buffer admits by and the engine's log-probs the
off-policy losses read), which the compiler checks against the method's `writes`.

**The stream's protocol** (`StreamingRole`): a role that declares `STREAMS` answers
six calls, and `StreamCall` names them. The driver's stream client
(runtime/run_long/stream_client.py) and the step scheduler's buffer tasks
(runtime/stream_take.py, `FusedWorker.stream_take` / `stream_keep`) call them by
`StreamCall` member, never by a spelled name (tests/graph/test_stream_protocol.py
sweeps hybridflow/ for one); `stream_capability` refuses a class that declares
`STREAMS` and lacks one of them, naming it (`stream_start` and `stream_keep`, which
a run without a loop thread or an entrance pass never calls: a
`StreamProtocolWarning` for this release). Implementations: the rollout role's
(workers/rollout/stream_worker.py) and the agent role's (agents/stream.py), over one
base (workers/rollout/stream_role.py). Stateless.
"""
from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Protocol

from hybridflow.core.kinds import _Named

if TYPE_CHECKING:
    from hybridflow.core.batch import Batch

__all__ = ["Streams", "STREAMS_ATTR", "stream_capability", "StreamCall", "StreamingRole",
           "StreamProtocolWarning"]

STREAMS_ATTR = "STREAMS"


class Streams(_Named):
    """How a role streams its generate node's rows."""
    ENGINE = "engine"        # requests in flight in its engine, across weight updates
    EPISODES = "episodes"    # whole episodes per poll, each one weights version

    @property
    def needs_streaming_engine(self) -> bool:
        """The role's engine (`rollout.backend`) must declare streaming."""
        return self is Streams.ENGINE


class StreamingRole(Protocol):
    """The calls a streaming role answers, in the order of a run: submit prompts,
    start the engine loop (background only), poll for whole groups, take or keep
    them (a pass's tasks on the worker holding them), abort at the end."""

    def stream_submit(self, batch: Batch, **options) -> dict:
        """Queue the prompts sent to this rank; {uid: samples expected} (the reporting
        rank of an engine's group; {} from the others)."""

    def stream_start(self) -> bool:
        """Run the engine loop on a thread of its own (False: this role polls inline)."""

    def stream_poll(self, wait_s: float = 0.0, want: int = 1) -> dict:
        """{"groups": {uid: GroupStats tuple} that became whole, "busy", "rows",
        "counts"} (and "spans" from a background loop); never the rows."""

    def stream_take(self, uids: list[str], leave: bool = False,
                    producer: str | None = None) -> Batch:
        """`producer`'s rows of these whole groups (None: the samples)."""

    def stream_keep(self, kept: Batch | None, uids: list[str], dropped: list[str],
                    producer: str | None = None, layout: list | None = None,
                    drop_samples: bool = False) -> int:
        """An entrance pass's verdict on groups held here; the groups still held."""

    def stream_abort(self) -> int:
        """Drop what is not finished and the rows not taken; how many requests."""


class StreamCall:
    """The name of each `StreamingRole` call, read from the protocol itself: what the
    driver and the scheduler pass to the runtime (`call_each`, `submit`) to reach it
    on a worker. Plain strings (a str enum hashes by member name, not as its value)."""
    SUBMIT = StreamingRole.stream_submit.__name__
    START = StreamingRole.stream_start.__name__
    POLL = StreamingRole.stream_poll.__name__
    TAKE = StreamingRole.stream_take.__name__
    KEEP = StreamingRole.stream_keep.__name__
    ABORT = StreamingRole.stream_abort.__name__
    ALL = (SUBMIT, START, POLL, TAKE, KEEP, ABORT)
    # called only with a loop thread (START) or an entrance pass (KEEP): a role without
    # them ran before the protocol was declared; warned for a release, then refused
    LATER = (START, KEEP)


class StreamProtocolWarning(DeprecationWarning):
    """A streaming role without a call this release still lets it lack."""


warnings.filterwarnings("default", category=StreamProtocolWarning)  # its author reads it


def stream_capability(cls) -> Streams | None:
    """The `Streams` a worker class declares (None: it cannot stream); a TypeError
    naming the class when the declaration is not a `Streams`, or when the class lacks
    a call of the stream's protocol (`StreamingRole`; `StreamCall.LATER` warned)."""
    value = getattr(cls, STREAMS_ATTR, None)  # the declaration, as method_spec reads one
    if value is None:
        return None
    name = getattr(cls, "__name__", cls)
    if not isinstance(value, Streams):
        raise TypeError(f"{name}.{STREAMS_ATTR} must be a hybridflow.graph.streams.Streams "
                        f"({', '.join(m.value for m in Streams)}) or None, not {value!r}")
    missing = [c for c in StreamCall.ALL if not callable(getattr(cls, c, None))]
    refused = [c for c in missing if c not in StreamCall.LATER]
    advice = (f"(hybridflow.graph.streams.StreamingRole: {', '.join(StreamCall.ALL)}); "
              f"derive from hybridflow.workers.rollout.stream_role.StreamRoleCalls or "
              f"define them")
    if refused:
        raise TypeError(f"{name}.{STREAMS_ATTR} = Streams.{value.name}, but {name} lacks "
                        f"{refused} of the stream's calls {advice}")
    if missing:
        warnings.warn(f"{name}.{STREAMS_ATTR} = Streams.{value.name}, but {name} lacks "
                      f"{missing} of the stream's calls, which this release still allows "
                      f"(a run without a loop thread or an entrance pass does not call "
                      f"them) and the next refuses {advice}", StreamProtocolWarning,
                      stacklevel=2)
    return value
