"""RolloutWorker: the `rollout` role. Generates with an engine; holds no trainer.

Reads the `model`, `rollout` and `placement` sections. Two placements, one graph:

- Colocated with the actor (same pool, hence the same process; the default, since
  `served_by` folds an unplaced rollout onto the actor): it builds nothing and
  delegates `generate` to the colocated actor (`ctx.colocated["actor"]`), whose
  engine generates with the actor's own module: zero copy, and the same samples,
  metrics and `policy_version` as `actor.generate`.
- On a pool of its own (`placement.roles.rollout=<pool>`): it builds its own engine
  with its own copy of the initial weights (from the `model` section, same seed as
  the actor), and the compiler adds the weight-sync edge after the actor's update
  (`hybridflow/plan/weight_sync.py`): `actor.export_weights` -> `rollout.load_weights`.

Streaming (`trainer.async_mode=streaming`): the calls of `stream_worker.StreamCalls`
(submit / poll / abort on the engine, an optional engine loop on its own thread).

State: `_engine` (own engine, built at the first call; None when colocated), and
through it the `policy_version` of the weights it generates with; the streaming
calls' lock and thread (stream_worker.py).
"""
from __future__ import annotations

import time

from hybridflow.core.batch import Batch
from hybridflow.graph.dispatch import BROADCAST, DP, method
from hybridflow.graph.streams import Streams
from hybridflow.workers.base import Worker, metrics_batch
from hybridflow.workers.config import ModelConfig, RolloutConfig, read_section
from hybridflow.workers.mfu import FORWARD, engine_matmul_params, params_mfu, real_tokens
from hybridflow.workers.models import resolve_dtype
from hybridflow.workers.rollout.engine import EngineSpec, make_engine
from hybridflow.workers.rollout.generation import GENERATE_WRITES, generate_rows, \
    sampling_options
from hybridflow.workers.rollout.stream_worker import StreamCalls
from hybridflow.workers.rollout.weights import WEIGHT_KEYS, load_export

__all__ = ["RolloutWorker"]


def _placed_pools(cfg) -> tuple[dict, str | None]:
    """(placement.roles, the first pool) from the run config, whatever its form."""
    section = cfg.get("placement") if isinstance(cfg, dict) else getattr(cfg, "placement", None)
    if section is None:
        return {}, None
    get = section.get if hasattr(section, "get") else lambda k, d=None: getattr(section, k, d)
    roles, pools = dict(get("roles") or {}), list(dict(get("pools") or {}))
    return roles, (pools[0] if pools else None)


class RolloutWorker(StreamCalls, Worker):
    HOST_ROLE = "actor"  # whose weights this role generates with, and syncs from
    STREAMS = Streams.ENGINE  # through its engine's submit / poll / abort (stream_worker.py)

    @classmethod
    def served_by(cls, cfg) -> str | None:
        """The actor, unless `placement.roles.rollout` puts this role on another pool
        than the actor's: then it holds its own weights (and the plan syncs them)."""
        roles, first = _placed_pools(cfg)
        own = roles.get("rollout")
        return cls.HOST_ROLE if own is None or own == roles.get(cls.HOST_ROLE, first) \
            else None

    def __init__(self, cfg, ctx=None):
        super().__init__(cfg, ctx)
        self.model_cfg = read_section(cfg, "model", ModelConfig)
        self.rollout_cfg = read_section(cfg, "rollout", RolloutConfig)
        self.device = self._device(self.model_cfg.device)
        self._engine = None

    def _host(self):
        """The colocated actor worker (anything bound to the role with a `generate`),
        or None when this role runs without one."""
        host = self.ctx.colocated.get(self.HOST_ROLE)
        return host if callable(getattr(host, "generate", None)) else None

    @property
    def engine(self):
        """The engine generating for this role: the colocated actor's (None if that
        actor has none) or this role's own, built at the first use."""
        host = self._host()
        if host is not None:
            return getattr(host, "engine", None)
        if self._engine is None:
            from hybridflow.workers.tokenizer import load_tokenizer, tokenizer_spec
            tokenizer = load_tokenizer(tokenizer_spec(self.model_cfg))
            self._engine = make_engine(EngineSpec(self.model_cfg, self.rollout_cfg, tokenizer,
                                                  self.ctx, self.device))
        return self._engine

    @property
    def module(self):
        """The weights this role holds in this process (for the memory metrics)."""
        return getattr(self.engine, "module", None)

    @property
    def policy_version(self) -> int:
        host = self._host()
        return int(host.policy_version if host is not None else self.engine.policy_version)

    @method(dispatch=DP, reads=("input_ids", "attention_mask"), writes=GENERATE_WRITES,
            kind="generate", overwrites=("input_ids", "attention_mask", "position_ids"),
            forwards=True)
    def generate(self, batch: Batch, n: int | None = None, temperature: float | None = None,
                 top_p: float | None = None, top_k: int | None = None,
                 max_new_tokens: int | None = None, do_sample: bool | None = None) -> Batch:
        """n responses per prompt (rows repeated interleaved: aabb), each carrying its
        prompt's other columns and its `policy_version`; see actor.generate."""
        host = self._host()
        if host is not None:
            return host.generate(batch, n=n, temperature=temperature, top_p=top_p,
                                 top_k=top_k, max_new_tokens=max_new_tokens,
                                 do_sample=do_sample)
        opts = sampling_options(self.rollout_cfg, n=n, temperature=temperature, top_p=top_p,
                                top_k=top_k, max_new_tokens=max_new_tokens,
                                do_sample=do_sample)
        with self.stream_lock:  # not inside a streaming loop's decode step (validation)
            began = time.perf_counter()
            out = generate_rows(self.engine, batch, opts)
        out.meta["metrics"].update(params_mfu(  # perf/mfu, as actor.generate reports it
            engine_matmul_params(self.engine), self.device,
            resolve_dtype(self.model_cfg.dtype), FORWARD, real_tokens(out), began))
        return out

    @method(dispatch=BROADCAST, reads=WEIGHT_KEYS, writes=(), kind="inference")
    def load_weights(self, batch: Batch) -> Batch:
        """The actor's exported weights (the weight-sync edge), loaded into this rank's
        engine bucket by bucket; they become the weights of the next generate."""
        if self._host() is not None:
            raise RuntimeError("rollout.load_weights was called on a rollout colocated with "
                               "the actor: it generates with the actor's own weights and "
                               "has nothing to load (the plan adds no weight sync then)")
        with self.stream_lock:  # a streaming loop's requests see it between two steps
            index, load_s = load_export(self.engine, batch)
        tp = int(getattr(self.engine, "tp", 1))  # ranks per engine
        return metrics_batch(Batch(), {
            # every rank received the whole export: bytes moved over the pool
            "engine/weight_sync_bytes": index.nbytes * self.ctx.world_size,
            "rollout/weight_load_s": load_s,
            "rollout/policy_version": index.version,
            # only where the engine spans ranks: a tp=1 split run logs what a colocated one does
            **({"rollout/engine_tp": tp} if tp > 1 else {}),
        })
