"""Issue 36, items 3 and 5: the placement section's names and pinned cores are checked
when the placement is read, in the project's words -- the rules swept over each way
to break them (program/placement_checks.py)."""
from __future__ import annotations

import itertools

import pytest

from hybridflow.core.constraints import ConfigError
from hybridflow.plan.placement import PoolSpec
from hybridflow.program.placement_checks import (allowed_cores, check_placement_names,
                                                 check_pool_cores)

ROLES = {"actor", "rollout", "ref", "reward", "critic"}


def pools(**cores) -> dict:
    return {name: PoolSpec(name, 1, 1, tuple(c) if c is not None else None)
            for name, c in cores.items()}


# ------------------------------------------------------------------ pinned cores
@pytest.mark.parametrize("first, second", [
    ([0, 1], [1]), ([0], [0]), ([0, 1, 2, 3], [3, 4]), ([5, 2], [2, 7]),
])
def test_two_pools_on_one_core_are_refused_naming_both_and_the_cores(first, second):
    with pytest.raises(ConfigError) as err:
        check_pool_cores(pools(main=first, gen=second), local=True,
                         allowed=set(range(16)))
    message = str(err.value)
    shared = sorted(set(first) & set(second))
    assert f"placement.pools.gen.cores={second}" in message
    assert f"placement.pools.main.cores={first}" in message
    assert f"both list core(s) {shared}" in message


def test_overlap_is_refused_even_when_the_workers_run_elsewhere():
    with pytest.raises(ConfigError, match="two pools never share a core"):
        check_pool_cores(pools(main=[0], gen=[0]), local=False, allowed=set())


@pytest.mark.parametrize("cores, allowed, missing, said", [
    ([2], {0, 1}, [2], "0-1"),
    ([0, 9], {0, 1, 2, 5}, [9], "0-2,5"),
    ([4, 5], {0, 1, 2, 3}, [4, 5], "0-3"),
])
def test_cores_this_process_may_not_run_on_are_refused(cores, allowed, missing, said):
    with pytest.raises(ConfigError) as err:
        check_pool_cores(pools(main=cores), local=True, allowed=allowed)
    message = str(err.value)
    assert f"placement.pools.main.cores={cores}: core(s) {missing}" in message
    assert f"may run on ({said})" in message


def test_cores_of_a_cluster_elsewhere_are_not_checked_against_this_machine():
    check_pool_cores(pools(main=[4000], gen=[4001]), local=False, allowed={0})


@pytest.mark.parametrize("layout", [
    {"main": [0], "gen": [1]}, {"main": [0], "gen": None}, {"main": None, "gen": None},
])
def test_disjoint_cores_of_this_machine_pass(layout):
    check_pool_cores(pools(**layout), local=True, allowed={0, 1})


def test_the_machine_is_read_from_the_affinity_mask():
    mine = allowed_cores()
    assert mine and all(isinstance(c, int) for c in mine)
    check_pool_cores(pools(main=[min(mine)]), local=True)  # the default reads it


@pytest.mark.parametrize("override, words", [
    ("placement.pools.main.cores=abc", "takes a list, e.g. placement.pools.main.cores=[0,1]"),
    ("placement.pools.main.cores=[abc]", "placement.pools.main.cores[0]"),
    ("placement.pools.main.cores=[]", "non-empty list of distinct core ids"),
    ("placement.pools.main.cores=[0,0]", "non-empty list of distinct core ids"),
    ("placement.pools.main.cores=[-1]", "non-empty list of distinct core ids"),
])
def test_a_cores_value_that_is_not_a_list_of_ids_is_said_in_the_projects_words(
        override, words):
    from hybridflow.program.config import build_config
    with pytest.raises(ConfigError) as err:
        build_config(overrides=[override])
    assert words in str(err.value) and "AnyNode" not in str(err.value)


# ------------------------------------------------------------------ names
@pytest.mark.parametrize("kind, role, close", [
    ("roles", "actr", "actor"), ("parallel", "actr", "actor"), ("roles", "refs", "ref"),
    ("parallel", "rolout", "rollout"), ("parallel", "critc", "critic"),
])
def test_a_misspelt_role_is_refused_with_the_closest_names(kind, role, close):
    section = {"pools": {"main": {}}, kind: {role: "main" if kind == "roles" else {"tp": 2}}}
    with pytest.raises(ConfigError) as err:
        check_placement_names(section, ROLES)
    message = str(err.value)
    assert message.startswith(f"placement.{kind}.{role}: there is no role '{role}'")
    assert f"did you mean '{close}'" in message


@pytest.mark.parametrize("pool, names", [("mian", ["main"]), ("gne", ["gen"]),
                                         ("zzz", [])])
def test_a_role_on_a_pool_that_does_not_exist_is_refused(pool, names):
    section = {"pools": {"main": {}, "gen": {}}, "roles": {"ref": pool}}
    with pytest.raises(ConfigError) as err:
        check_placement_names(section, ROLES)
    message = str(err.value)
    assert f"placement.roles.ref='{pool}': there is no pool '{pool}'" in message
    assert "(known: gen, main)" in message
    for name in names:
        assert f"did you mean '{name}'" in message


@pytest.mark.parametrize("kind, role", itertools.product(("roles", "parallel"), sorted(ROLES)))
def test_every_known_role_may_be_placed_and_laid_out(kind, role):
    section = {"pools": {"main": {}}, kind: {role: "main" if kind == "roles" else {"tp": 1}}}
    check_placement_names(section, ROLES)
