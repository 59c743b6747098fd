"""`check --memory` sizes a sequence-parallel role per rank (issue 38 item 3): a rank's
layers hold width / sp positions (the row padded to a multiple of sp), so at sp=2 the
saved activations of actor.update and the layer temporaries of the log-prob passes are
about half of sp=1's for the same rows, and so are the logits: each rank computes the
log-probs of its own slice's positions (workers/sequences.head_stats), at most
width / sp of a row, or one chunk of them."""
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
    # the last rank's slice: 2081 positions, every one predicting a response token
    assert micro.local_width == 2081 and micro.logit_positions == 2081
    assert MicroBatch(1, 64, 4096).local_width == 4160
    assert MicroBatch(1, 64, 4096).logit_positions == 4097
    # a short response: no rank holds more than the response's positions
    assert MicroBatch(2, 4000, 100, sp=4).logit_positions == 101
    # chunked: one chunk of the slice's positions at a time
    assert MicroBatch(1, 64, 4097, sp=2, logit_chunk=341).held_logit_positions == 341


def test_sp_2_halves_the_activations_and_the_logits_per_rank():
    one, two = report(*ONE, "actor.logprob_chunk=0"), report(*SP2, "actor.logprob_chunk=0")
    update_one = role(one, "actor").passes["actor.update"]
    update_two = role(two, "actor").passes["actor.update"]
    assert update_two["activations"] < 0.55 * update_one["activations"]
    assert 0.45 * update_one["logits"] < update_two["logits"] < 0.55 * update_one["logits"]
    assert role(two, "actor").passes["actor.update"]["batch"] == update_one["batch"]

