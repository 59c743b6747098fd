"""Typed run modes: how the rollout runs ahead (`AsyncMode`) and which executor runs the
plan (`RuntimeName`), each declaring what it can do so the layers above read a
capability instead of comparing strings.

The config keeps plain strings (`trainer.async_mode=streaming`, `runtime.name=ray`):
both are `str` enums (`kinds._Named`), so a member equals its value and the config's
`one_of` rule is built from the members (`AsyncMode.names()`). The config's strings
become members in one place, `run_modes(cfg)` (a `RunModes`), which every layer asks
for the capability: `run_modes(cfg).runtime.process_per_rank`, not a compare of
`cfg.runtime.name` (tests/test_mode_conversions.py holds the line). This module keeps
no state.
"""
from __future__ import annotations

from dataclasses import dataclass

from hybridflow.core.kinds import _Named

__all__ = ["AsyncMode", "RuntimeName", "StreamSide", "RunModes", "run_modes"]


class _Choice(_Named):
    @classmethod
    def names(cls) -> tuple[str, ...]:
        """The values a config may spell, in declaration order."""
        return tuple(m.value for m in cls)


class AsyncMode(_Choice):
    """`trainer.async_mode`: how the rollout runs ahead when `trainer.staleness >= 1`."""
    PIPELINE = "pipeline"      # whole batches generated k steps ahead (plan/async_split.py)
    STREAMING = "streaming"    # continuous generation, groups handed over as they finish

    @property
    def streams(self) -> bool:
        """Generation runs continuously beside training (the plan's buffer streams; the
        engine must submit / poll / abort; every prompt row has one width)."""
        return self is AsyncMode.STREAMING


class StreamSide(_Choice):
    """`trainer.stream_side`: which nodes a streaming plan runs on the stream side
    (plan/streaming_split.py)."""
    AUTO = "auto"                    # the compiler moves the nodes that can (docs/async.md)
    GENERATE_ONLY = "generate_only"  # the generate node (and a gather's filter) only

    @property
    def moves(self) -> bool:
        return self is StreamSide.AUTO


class RuntimeName(_Choice):
    """`runtime.name`: the executor that runs the plan (`runtime/local.py`,
    `runtime/ray/`)."""
    LOCAL = "local"
    RAY = "ray"

    @property
    def process_per_rank(self) -> bool:
        """Each rank of a pool is a process of its own, so ranks can run collectives
        (tensor parallelism, training on several ranks) and pools are real devices. The
        local runtime runs every role of every pool inline in one process."""
        return self is RuntimeName.RAY

    @property
    def joins_cluster(self) -> bool:
        """Reads the cluster keys (`runtime.address`, `num_cpus`, `num_gpus`, the start
        and connect timeouts, `listen_all`)."""
        return self is RuntimeName.RAY


@dataclass(frozen=True)
class RunModes:
    """A run's modes as members, converted from its config by `run_modes`."""
    async_mode: AsyncMode = AsyncMode.PIPELINE
    stream_side: StreamSide = StreamSide.AUTO
    runtime: RuntimeName = RuntimeName.LOCAL


def _value(cfg, section: str, key: str):
    """`cfg.<section>.<key>` of a DictConfig, a typed `RunConfig` or a plain dict; None
    when absent (a partial config: the schema's default applies)."""
    part = cfg.get(section) if isinstance(cfg, dict) else getattr(cfg, section, None)
    if part is None:
        return None
    return part.get(key) if isinstance(part, dict) else getattr(part, key, None)


def run_modes(cfg) -> RunModes:
    """The one place a config's mode strings (`trainer.async_mode`, `trainer.stream_side`,
    `runtime.name`) become members; a value no member has is a ValueError naming the key
    and the allowed values (the config's own check refuses it first)."""
    default = RunModes()
    fields = (("trainer", "async_mode", AsyncMode, default.async_mode),
              ("trainer", "stream_side", StreamSide, default.stream_side),
              ("runtime", "name", RuntimeName, default.runtime))
    values = []
    for section, key, kind, fallback in fields:
        value = _value(cfg, section, key)
        values.append(fallback if value is None else kind.of(value, f"{section}.{key}"))
    return RunModes(*values)
