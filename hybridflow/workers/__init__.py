"""Role workers: actor (rollout, log-probs, update with the graph's loss, SFT), reference,
critic, reward.

See docs/workers.md for each method's keys, kwargs and config.
"""
from hybridflow.workers.actor import ActorWorker
from hybridflow.workers.base import Worker, WorkerContext
from hybridflow.workers.critic import CriticWorker
from hybridflow.workers.reference import ReferenceWorker
from hybridflow.workers.reward import RewardWorker

__all__ = ["ActorWorker", "CriticWorker", "ReferenceWorker", "RewardWorker", "Worker",
           "WorkerContext", "DEFAULT_ROLES"]

DEFAULT_ROLES = {"actor": ActorWorker, "ref": ReferenceWorker, "critic": CriticWorker,
                 "reward": RewardWorker}
