"""Fake roles for tests, declared by the real workers' contracts so they cannot drift.

Each fake method takes its `MethodSpec` (dispatch mode, keys read and written, kind,
kwargs) from the real worker's method of the same name (`declared_as`), so a graph
that compiles against the fakes compiles against the real roles, and a change to a
real declaration reaches every test that uses a fake. The bodies are cheap,
deterministic and row-wise: no model, no tokenizer, any device count.

State: each fake keeps only `updates`, the number of `update` calls it served (the
fake actor's log-probs move with it, so a test can see that an update happened).

On Ray, ship the fakes by value as the CLI ships graph files:
`ray.cloudpickle.register_pickle_by_value(tests.support.fakes)`.
"""
from __future__ import annotations

import functools

import torch

from hybridflow.core.columns import uniform_token_versions
from hybridflow.core.batch import Batch
from hybridflow.graph.dispatch import method_spec
from hybridflow.workers import ActorWorker, CriticWorker, ReferenceWorker, RewardWorker
from hybridflow.workers.base import metrics_batch

RESPONSE_LENGTH = 4  # tokens per fake response
VOCAB = 32  # fake token ids stay below this


def declared_as(worker_cls: type, name: str):
    """Give the decorated fake body the contract of `worker_cls.name`.

    The returned method carries the real `MethodSpec` (functools copies the function's
    attributes) and reports the real signature, so the compiler checks graph kwargs
    against the real method's parameters.
    """
    if method_spec(worker_cls, name) is None:
        raise TypeError(f"{worker_cls.__name__}.{name} is not a declared worker method")
    real = getattr(worker_cls, name)

    def wrap(body):
        def fake(self, batch: Batch, **kwargs) -> Batch:
            return body(self, batch, **kwargs)
        functools.update_wrapper(fake, real, assigned=("__doc__",), updated=("__dict__",))
        fake.__name__, fake.__qualname__ = body.__name__, body.__qualname__
        return fake
    return wrap


def fake_prompts(rows: int, width: int = 3) -> Batch:
    """`rows` prompts with every key a graph source provides by default."""
    ids = torch.arange(rows * width, dtype=torch.int64).reshape(rows, width).remainder(VOCAB)
    mask = torch.ones_like(ids)
    tensors = {"input_ids": ids, "attention_mask": mask, "position_ids": mask.cumsum(-1) - 1}
    columns = {"uid": [f"u{i}" for i in range(rows)], "raw_prompt": [f"p{i}" for i in range(rows)],
               "data_source": ["fake"] * rows, "ground_truth": [str(i % 2) for i in range(rows)],
               "extra_info": [{} for _ in range(rows)]}
    return Batch(tensors, columns)


class FakeRole:
    """Constructed like a real worker, `cls(cfg, ctx)`; both may be omitted in tests."""

    REAL: type  # the worker class this fake stands for

    def __init__(self, cfg=None, ctx=None):
        self.cfg, self.ctx = cfg, ctx
        self.updates = 0


def _policy_logprob(responses: torch.Tensor, updates: int) -> torch.Tensor:
    """A fixed per-token log-prob, shifted by how many updates the policy took."""
    return -0.1 * (responses.remainder(5) + 1).float() - 0.01 * updates


class FakeActor(FakeRole):
    """generate: n responses per prompt of `RESPONSE_LENGTH` tokens, all kept;
    logprob: `_policy_logprob`; update: counts itself and reports one metric."""

    REAL = ActorWorker

    @declared_as(ActorWorker, "generate")
    def generate(self, batch: Batch, n: int | None = None, **_) -> Batch:
        n = n or 1
        prompts = batch.repeat(n, interleave=True)
        ids, mask = prompts["input_ids"], prompts["attention_mask"]
        sample = torch.arange(len(prompts)).remainder(n).unsqueeze(-1)
        responses = (ids.sum(-1, keepdim=True) + sample
                     + torch.arange(RESPONSE_LENGTH)).remainder(VOCAB)
        response_mask = torch.ones_like(responses)
        full_mask = torch.cat([mask, response_mask], dim=-1)
        out = prompts.drop("position_ids") if "position_ids" in prompts else prompts
        out = out.update(Batch({
            "prompts": ids, "responses": responses, "response_mask": response_mask,
            "input_ids": torch.cat([ids, responses], dim=-1), "attention_mask": full_mask,
            "position_ids": (full_mask.cumsum(-1) - 1).clamp(min=0),
            "response_length": response_mask.sum(-1),
            "rollout_log_probs": _policy_logprob(responses, self.updates),
            "policy_version": torch.full((len(prompts),), self.updates),
            "token_versions": uniform_token_versions(response_mask, self.updates)}))
        return metrics_batch(out, {"response_length/mean": float(RESPONSE_LENGTH)})

    @declared_as(ActorWorker, "logprob")
    def logprob(self, batch: Batch, **_) -> Batch:
        return Batch({"old_log_probs": _policy_logprob(batch["responses"], self.updates)})

    @declared_as(ActorWorker, "update")
    def update(self, batch: Batch, **_) -> Batch:
        self.updates += 1
        mask = batch["response_mask"].float()
        weighted = batch["advantages"] * batch["old_log_probs"] * mask
        loss = -weighted.sum() / mask.sum().clamp(min=1)
        return metrics_batch(Batch(), {"actor/pg_loss": float(loss),
                                       "actor/updates": float(self.updates)})


class FakeReference(FakeRole):
    """logprob: the fake actor's log-probs before any update."""

    REAL = ReferenceWorker

    @declared_as(ReferenceWorker, "logprob")
    def logprob(self, batch: Batch, **_) -> Batch:
        return Batch({"ref_log_prob": _policy_logprob(batch["responses"], 0)})


class FakeCritic(FakeRole):
    """values: half of each response token's id over the vocabulary; update: one metric."""

    REAL = CriticWorker

    @declared_as(CriticWorker, "values")
    def values(self, batch: Batch, **_) -> Batch:
        return Batch({"values": batch["responses"].float() / (2 * VOCAB)})

    @declared_as(CriticWorker, "update")
    def update(self, batch: Batch, **_) -> Batch:
        self.updates += 1
        mask = batch["response_mask"].float()
        err = ((batch["values"] - batch["returns"]) ** 2 * mask).sum() / mask.sum().clamp(min=1)
        return metrics_batch(Batch(), {"critic/vf_loss": float(err)})


class FakeReward(FakeRole):
    """score: 1.0 when the response's first token is even, else 0.0, placed on the
    last response token (`token_level_scores`) as the real reward does."""

    REAL = RewardWorker

    @declared_as(RewardWorker, "score")
    def score(self, batch: Batch, **_) -> Batch:
        responses, mask = batch["responses"], batch["response_mask"]
        scores = (responses[:, 0].remainder(2) == 0).float()
        token_level = torch.zeros(responses.shape, dtype=torch.float32)
        last = (mask.sum(-1) - 1).clamp(min=0)
        if len(responses):
            token_level[torch.arange(len(responses)), last] = scores
        return Batch({"token_level_scores": token_level, "scores": scores})


FAKE_ROLES = {"actor": FakeActor, "ref": FakeReference, "critic": FakeCritic,
              "reward": FakeReward}
