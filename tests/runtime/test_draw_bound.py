"""DAPO's bound as one object (runtime/draw_bound.py), read by a gather's rounds and
by the streaming entrance: its three rules on the numbers each waiter counts, and the
error a wait that reached it with nothing kept stops the run with."""
from hybridflow.plan.compiler import PlanNode
from hybridflow.core.kinds import NodeKind, Op
from hybridflow.runtime.draw_bound import DrawBound
from hybridflow.runtime.progress import NoProgressError


def _gather(max_rounds: int) -> PlanNode:
    return PlanNode("keep", NodeKind.FUNCTION, Op.GATHER, ("filter",), "g.py:4",
                    kwargs={"until": 8, "max_rounds": max_rounds})


def test_a_gather_draws_at_most_max_rounds_extra_rounds():
    bound = DrawBound.of(_gather(2))
    assert [bound.may_draw(extra) for extra in range(4)] == [True, True, False, False]
    assert not DrawBound.of(_gather(0)).may_draw(0)


def test_a_stream_counts_rounds_in_groups_per_step():
    bound = DrawBound.of(_gather(2), per_round=4)
    assert not bound.spent(8) and bound.spent(9)  # more than 2 steps' worth dropped
    assert bound.limit(in_flight=5) == 3 * 4 + 5  # those in flight and 3 rounds' worth


def test_a_wait_at_its_bound_names_the_filter_and_the_bound():
    err = DrawBound.of(_gather(3)).no_progress(2, "node 'f' (g.py:3)", 16, 16, 4, "groups",
                                               "f")
    assert isinstance(err, NoProgressError) and err.node == "f"
    assert str(err).startswith("step 2: no trainable row: the filter node 'f' (g.py:3) "
                               "dropped 16 of the 16 groups drawn for this step, in 4 "
                               "draw(s) (the bound: max_rounds=3 extra draws)")


def test_the_step_schedulers_helpers_use_its_public_surface():
    """gather_rounds.py and stream_take.py call no private method of the scheduler
    (`submit_task`, `set_output`, `put_output`, `sub_pass` instead)."""
    import os
    import re
    root = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__)))), "hybridflow", "runtime")
    for name in ("gather_rounds.py", "stream_take.py"):
        with open(os.path.join(root, name), encoding="utf-8") as handle:
            assert not re.findall(r"\bsched\._\w+", handle.read()), name
