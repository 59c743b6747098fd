"""`check --memory` sizes a sequence-parallel role per rank (issue 38 item 3): a rank's
layers hold width / sp positions (the row padded to a multiple of sp), so at sp=2 the
saved activations of actor.update and the layer temporaries of the log-prob passes are
about half of sp=1's for the same rows; the logits are gathered whole on every rank
(workers/parallel/sequence_parallel.py) and do not shrink."""
from __future__ import annotations

import os

from hybridflow.memory.passes import MicroBatch
from hybridflow.memory.report import plan_memory
from hybridflow.program.assemble import prepare
from tests.support.recorded_runs import REPO

# one long row a step: 2 ranks at sp=2 (dp 1) against 1 rank at sp=1 (dp 1)
LONG = ("data.batch_size=1", "rollout.n=1", "actor.mini_batch_size=1",
        "rollout.max_new_tokens=4096", "actor.micro_batch_size=1")
ONE = ("placement.pools.main.devices_per_node=1",)
SP2 = ("runtime.name=ray", "placement.pools.main.devices_per_node=2",
       "placement.parallel.actor.sp=2", "placement.parallel.ref.sp=2")


def report(*overrides):
    loaded = prepare(os.path.join(REPO, "graphs", "grpo.py"), [*LONG, *overrides],
                     preflight=False)
    return plan_memory(loaded.cfg, loaded.plan)


def role(rep, name):
    return next(r for r in rep.roles if r.role == name)


def test_a_rank_holds_its_share_of_the_positions():
    micro = MicroBatch(1, 64, 4097, sp=2)
    assert micro.local_width == 2081 and micro.logit_positions == 4098
    assert MicroBatch(1, 64, 4096).local_width == 4160


def test_sp_2_halves_the_activations_per_rank_not_the_logits():
    one, two = report(*ONE), report(*SP2)
    update_one = role(one, "actor").passes["actor.update"]
    update_two = role(two, "actor").passes["actor.update"]
    assert update_two["activations"] < 0.55 * update_one["activations"]
    assert update_two["logits"] == update_one["logits"]
    assert role(two, "actor").passes["actor.update"]["batch"] == update_one["batch"]

