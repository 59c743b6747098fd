"""Role workers: actor (log-probs, update with the graph's loss, SFT, and generate through
its own rollout engine), rollout (generate, colocated with the actor or on its own pool),
reference,
critic, reward.

See docs/workers.md for each method's keys, kwargs and config, docs/rollout.md for
the rollout role and its engines.

May import `core/` and `graph/` only: the runtime hosts workers, workers never reach
into the runtime, the plan or the program.
"""
from hybridflow.workers.actor import ActorWorker
from hybridflow.workers.base import Worker, WorkerContext
from hybridflow.workers.critic import CriticWorker
from hybridflow.workers.reference import ReferenceWorker
from hybridflow.workers.reward import RewardWorker
from hybridflow.workers.rollout.worker import RolloutWorker

__all__ = ["ActorWorker", "CriticWorker", "ReferenceWorker", "RewardWorker", "RolloutWorker",
           "Worker", "WorkerContext", "DEFAULT_ROLES"]

DEFAULT_ROLES = {"actor": ActorWorker, "rollout": RolloutWorker, "ref": ReferenceWorker,
                 "critic": CriticWorker, "reward": RewardWorker}
