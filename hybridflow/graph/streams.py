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
Stateless.
"""
from __future__ import annotations

from hybridflow.core.kinds import _Named

__all__ = ["Streams", "STREAMS_ATTR", "stream_capability"]

STREAMS_ATTR = "STREAMS"


class Streams(_Named):
    """How a role streams its generate node's rows."""
    ENGINE = "engine"        # requests in flight in its engine, across weight updates
    EPISODES = "episodes"    # whole episodes per poll, each one weights version

    @property
    def needs_streaming_engine(self) -> bool:
        """The role's engine (`rollout.backend`) must declare streaming."""
        return self is Streams.ENGINE


def stream_capability(cls) -> Streams | None:
    """The `Streams` a worker class declares (None: it cannot stream); a TypeError
    naming the class when the declaration is not a `Streams`."""
    value = getattr(cls, STREAMS_ATTR, None)  # the declaration, as method_spec reads one
    if value is None or isinstance(value, Streams):
        return value
    raise TypeError(f"{getattr(cls, '__name__', cls)}.{STREAMS_ATTR} must be a "
                    f"hybridflow.graph.streams.Streams ({', '.join(m.value for m in Streams)})"
                    f" or None, not {value!r}")
