"""Where a run's weights and state come from, for `hybridflow check` and
`hybridflow render --plan`: the model each role loads, and the function nodes that
keep state across steps (checkpointed with the run). Stateless: reads a config
and a compiled plan.

A worker class may say what it loads with a `model_source(cfg) -> str` class or
static method; the built-in roles are described from their config sections here.
"""
from __future__ import annotations

from hybridflow.plan.compiler import ExecutionPlan
from hybridflow.core.kinds import Op

__all__ = ["model_sources", "stateful_nodes", "provenance_lines"]


def _section(cfg, name: str):
    return cfg.get(name) if hasattr(cfg, "get") else getattr(cfg, name, None)


def _policy(cfg) -> str:
    path = _section(cfg, "model").get("path")
    return f"{path} (model.path)" if path else "new random weights from model.hf_config " \
                                                "(seeded by trainer.seed)"


def _builtin_source(role: str, cls, cfg) -> str | None:
    from hybridflow.workers import ActorWorker, CriticWorker, ReferenceWorker
    if cls is ActorWorker:
        return _policy(cfg)
    if cls is ReferenceWorker:
        own = _section(cfg, "ref").get("path")
        if own:
            return f"{own} (ref.path)"
        policy = _section(cfg, "model").get("path")
        return (f"{policy} (ref.path unset: the initial policy)" if policy
                else "the actor's initial weights (ref.path unset; same seed)")
    if cls is CriticWorker:
        own, policy = _section(cfg, "critic").get("path"), _section(cfg, "model").get("path")
        base = (f"{own} (critic.path)" if own else
                f"{policy} (critic.path unset: model.path)" if policy else
                "new random weights from model.hf_config (critic.path unset)")
        return f"{base} with a new value head"
    return None


def model_sources(cfg, plan: ExecutionPlan) -> dict[str, str]:
    """role -> what it loads, for every role the plan calls."""
    out = {}
    for role in plan.roles:
        cls = plan.bindings.get(role)
        host = plan.placement.folded.get(role)
        hook = getattr(cls, "model_source", None)
        if host is not None:
            out[role] = f"no model of its own: served by the {host} worker"
        elif callable(hook):
            out[role] = hook(cfg)
        else:
            out[role] = _builtin_source(role, cls, cfg) or \
                f"whatever {getattr(cls, '__name__', cls)} loads (it has no model_source())"
    return out


def stateful_nodes(plan: ExecutionPlan) -> list[str]:
    """Function nodes with `state_dict()`: they run on the driver and are saved."""
    return [n.name for n in plan.nodes
            if n.op == Op.FN and callable(getattr(n.fn, "state_dict", None))]


def provenance_lines(cfg, plan: ExecutionPlan) -> list[str]:
    lines = ["weights:"]
    lines += [f"  {role}: {source}" for role, source in model_sources(cfg, plan).items()]
    state = stateful_nodes(plan)
    lines.append("function nodes that keep state across steps (checkpointed): "
                 + (", ".join(state) if state else "none"))
    return lines
