"""Rollout cost: response-length distribution, tensor-parallel cost, engine switch."""
import dataclasses

import pytest
from planner_graphs import a100, grpo_graph, same_size

from hybridflow.planner import Workload
from hybridflow.planner.cost import CostModel
from hybridflow.planner.devices import GIB
from hybridflow.planner.lengths import expected_longest
from hybridflow.planner.problem import PlanningError, build_problem

BASE = Workload(prompts=256, samples_per_prompt=8, prompt_len=256, response_len=4096)


def generate_seconds(workload, devices=8, tp=1, size="7b"):
    cost = CostModel(build_problem(grpo_graph(), a100(devices), same_size(size, ("actor", "ref")),
                                   workload))
    return cost.generate_cost("actor", devices, tp, free_bytes=60 * GIB)


def test_the_longest_response_grows_with_the_count_and_the_spread_and_stops_at_the_max():
    work = dataclasses.replace(BASE, response_mean=1000, response_sigma=0.8)
    assert expected_longest(work, 1) == 1000
    assert 1000 < expected_longest(work, 8) < expected_longest(work, 256) <= 4096
    narrow = dataclasses.replace(work, response_sigma=0.2)
    assert expected_longest(narrow, 256) < expected_longest(work, 256)
    assert expected_longest(BASE, 256) == 4096  # no mean given: every response is the max


def test_shorter_mean_responses_decode_faster_but_the_tail_still_costs():
    full = generate_seconds(BASE)
    short = generate_seconds(dataclasses.replace(BASE, response_mean=1000, response_sigma=0.8))
    exact = generate_seconds(dataclasses.replace(BASE, response_mean=1000, response_sigma=0.0))
    assert short.seconds < full.seconds
    assert exact.seconds < short.seconds  # a long tail keeps the replica decoding at low occupancy
    assert short.decode_steps > exact.decode_steps


def test_mean_response_must_lie_under_the_max():
    with pytest.raises(PlanningError, match="response_mean"):
        dataclasses.replace(BASE, response_mean=5000)


def test_tensor_parallel_communication_and_efficiency_grow_with_tp():
    """Device-seconds of a rollout grow with tp: all-reduces and smaller shards cost."""
    device_seconds = [generate_seconds(BASE, tp=tp).seconds * tp for tp in (1, 2, 4, 8)]
    assert device_seconds == sorted(device_seconds)
    cost = CostModel(build_problem(grpo_graph(), a100(8), same_size("7b", ("actor", "ref")),
                                   BASE))
    reduces = [cost.tp_allreduce(1e6, tp) for tp in (1, 2, 4, 8)]
    assert reduces[0] == 0 and reduces == sorted(reduces) and reduces[3] > reduces[1]
    factors = [cost.eff.tp_factor(tp) for tp in (1, 2, 4, 8)]
    assert factors[0] == 1 and factors == sorted(factors, reverse=True)


def test_engine_switch_and_resharding_are_paid_once_a_step():
    from hybridflow.planner.formulas import Layout
    from hybridflow.planner.rollout import switch_seconds
    cost = CostModel(build_problem(grpo_graph(), a100(16), same_size("70b", ("actor", "ref")),
                                   BASE))
    model = cost.problem.models["actor"]
    switch = switch_seconds(cost, model, 16, Layout(4, 4))
    assert switch > cost.eff.engine_switch_s  # plus all-gathering the rollout weights
    assert switch_seconds(cost, model, 16, Layout(1, 16)) == cost.eff.engine_switch_s


def test_rollout_fed_in_calls_pays_each_calls_prefill_and_tail_by_hand():
    """rollout_call_sequences=b: a replica's m sequences decode in m/b calls of b, each
    running max(b x mean / batch, longest of b) steps (OpenRLHF 2024's micro-batched
    experience). Checked against the formula written out by hand."""
    from hybridflow.planner.formulas import Layout
    from hybridflow.planner.rollout import decode_step_seconds, prefill_seconds, switch_seconds
    work = dataclasses.replace(BASE, prompts=64, samples_per_prompt=1, response_mean=500,
                               response_sigma=0.6, rollout_call_sequences=4)
    devices = 4
    cost = CostModel(build_problem(grpo_graph(), a100(devices), same_size("7b", ("actor", "ref")),
                                   work))
    model = cost.problem.models["actor"]
    got = cost.generate_cost("actor", devices, 1, free_bytes=60 * GIB)
    calls, per_call = 64 // devices // 4, 4  # 16 sequences a replica, 4 a call
    longest = expected_longest(work, per_call)
    steps = max(per_call * 500 / per_call, longest)  # the batch holds the whole call
    assert longest > 500 and steps == longest
    by_hand = (calls * prefill_seconds(cost, model, 1, per_call)
               + calls * steps * decode_step_seconds(cost, model, 1, per_call * 500 / steps)
               + switch_seconds(cost, model, devices, Layout(devices, 1))
               + cost.eff.node_call_overhead_s)
    assert got.seconds == pytest.approx(by_hand, rel=1e-9)
    assert got.decode_steps == pytest.approx(calls * longest)
    assert got.batch == per_call  # KV memory is held for one call's sequences only
    one_call = generate_seconds(dataclasses.replace(work, rollout_call_sequences=0), devices)
    assert one_call.seconds < got.seconds  # one call pays the tail once, not 4 times
    assert one_call.decode_steps == pytest.approx(expected_longest(work, 16))


def test_rollout_call_size_must_not_be_negative():
    with pytest.raises(PlanningError, match="rollout_call_sequences"):
        dataclasses.replace(BASE, rollout_call_sequences=-1)
