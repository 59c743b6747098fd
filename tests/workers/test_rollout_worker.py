"""The `rollout` role (hybridflow/workers/rollout/worker.py) and the weights it
receives (weights.py): colocated it is the actor's engine, on its own pool it holds
a copy that the weight-sync edge refreshes, and every row says which policy version
sampled it."""
import pytest
import torch

from tests.support.workers import make_cfg, prompt_batch
from hybridflow.core.batch import Batch
from hybridflow.workers import ActorWorker, RolloutWorker
from hybridflow.workers.base import WorkerContext
from hybridflow.workers.rollout.weights import load_export, policy_weights

PROMPTS = ["1+2=", "10+20=", "7*8=", "99-1="]


def pools(**roles):
    return {"placement": {"pools": {"main": {}, "gen": {}}, "roles": roles}}


@pytest.mark.parametrize("roles, host", [
    ({}, "actor"),                                  # unplaced: follows the actor
    ({"rollout": "main"}, "actor"),                 # beside the actor on the first pool
    ({"actor": "gen", "rollout": "gen"}, "actor"),
    ({"rollout": "gen"}, None),                     # its own pool: its own weights
    ({"actor": "gen", "rollout": "main"}, None),
])
def test_the_rollout_is_served_by_the_actor_unless_placed_away_from_it(roles, host):
    assert RolloutWorker.served_by(pools(**roles)) == host


def colocated_pair(cfg):
    shared: dict = {}
    actor = ActorWorker(cfg, WorkerContext(colocated=shared))
    shared["actor"] = actor
    rollout = RolloutWorker(cfg, WorkerContext(colocated=shared))
    shared["rollout"] = rollout
    return actor, rollout


def test_a_colocated_rollout_is_the_actor_engine_and_samples_what_the_actor_would():
    actor, rollout = colocated_pair(make_cfg())
    assert rollout.engine is actor.engine and rollout.module is actor.module  # zero copy
    batch = prompt_batch(actor.tokenizer, PROMPTS)
    torch.manual_seed(3)
    mine = rollout.generate(batch, n=2)
    torch.manual_seed(3)
    theirs = actor.generate(batch, n=2)
    assert torch.equal(mine["responses"], theirs["responses"])
    assert mine.meta["metrics"].keys() == theirs.meta["metrics"].keys()
    with pytest.raises(RuntimeError, match="nothing to load"):
        rollout.load_weights(actor.export_weights(Batch()))


def test_a_rollout_on_its_own_pool_holds_a_copy_that_the_export_refreshes():
    cfg = make_cfg(actor={"lr": 0.05})
    actor, rollout = ActorWorker(cfg), RolloutWorker(cfg)
    assert rollout.module is not actor.module
    assert all(torch.equal(a, b) for a, b in zip(actor.module.state_dict().values(),
                                                 rollout.module.state_dict().values()))
    with torch.no_grad():  # as an update would
        for p in actor.module.parameters():
            p.add_(0.01)
    actor.policy_version = 1
    out = rollout.load_weights(actor.export_weights(Batch()))
    assert all(torch.equal(a, b) for a, b in zip(actor.module.state_dict().values(),
                                                 rollout.module.state_dict().values()))
    assert rollout.policy_version == 1
    metrics = out.meta["metrics"]
    assert metrics["engine/weight_sync_bytes"] >= sum(
        p.numel() * p.element_size() for p in actor.module.parameters())
    gen = rollout.generate(prompt_batch(rollout.engine.tokenizer, PROMPTS), n=2)
    assert gen["policy_version"].tolist() == [1] * 8


def test_a_stale_or_malformed_export_is_refused():
    cfg = make_cfg()
    actor, rollout = ActorWorker(cfg), RolloutWorker(cfg)
    export = actor.export_weights(Batch())
    actor.policy_version += 1  # trained after the export: its weights moved on
    with pytest.raises(RuntimeError, match="stale"):
        rollout.load_weights(export)
    with pytest.raises(ValueError, match="actor.export_weights"):
        load_export(rollout.engine, Batch({"x": torch.zeros(2, 1)}))


def test_a_lora_policy_is_exported_merged_under_plain_names():
    pytest.importorskip("peft")
    cfg = make_cfg(actor={"lora": {"rank": 4}})
    actor = ActorWorker(cfg)
    weights = policy_weights(actor.module)
    plain = RolloutWorker(make_cfg()).module.state_dict()
    assert set(weights) == set(plain)
    assert not any("lora" in name or "base_layer" in name for name in weights)


def test_the_actor_checkpoints_its_update_count(tmp_path):
    actor = ActorWorker(make_cfg())
    actor.policy_version = 5
    actor.save_checkpoint(str(tmp_path))
    restored = ActorWorker(make_cfg())
    restored.load_checkpoint(str(tmp_path))
    assert restored.policy_version == 5
