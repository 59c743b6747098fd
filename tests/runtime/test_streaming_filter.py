"""DAPO's dynamic sampling streaming (runtime/run_long/stream_entrance.py, the streaming
scheduler's entrance filter) against a fake engine whose requests finish in a seeded
random order and a fake filter that drops a fixed set of groups: a dropped group is
never trained and its prompt never drawn again (also after a resume at any step),
more prompts are drawn in its place so each batch still fills, and `max_rounds`
bounds the wait as DAPO bounds its extra draws (a short batch of kept groups)."""
from __future__ import annotations

import functools
import os

import pytest

from hybridflow.runtime.common import StepResult
from hybridflow.runtime.run_long.run_scheduler import RunScheduler
from stream_fakes import N, REPO, SIZE, STEPS, FakeStream, Loader, Shards
from hybridflow.plan.streaming_split import ENTRANCE_PREFIX
from hybridflow.program.assemble import prepare

FEED = "buffer/rollout.generate"  # the entrance pass's feed (plan/stream_filter.py)
INSIDE = ENTRANCE_PREFIX + FEED  # its feed inside a training pass (streaming_split.py)


@functools.lru_cache(maxsize=None)
def dapo_plan(k: int, max_rounds: int):
    return prepare(os.path.join(REPO, "graphs", "dapo.py"),
                   [f"trainer.staleness={k}", "trainer.async_mode=streaming",
                    "trainer.allow_uncorrected_async=true", f"rollout.n={N}",
                    f"data.batch_size={SIZE}", f"actor.mini_batch_size={SIZE * N}",
                    f"algorithm.max_rounds={max_rounds}"], preflight=False).plan


def dropped(uid: str, every: int) -> bool:
    """Keeps u0, u<every>, ...: 1 group in `every`; `every` < 0: drops 1 in -every."""
    if every < 0:
        return int(uid[1:]) % -every == 1
    return int(uid[1:]) % every != 0


class FilteringStream(FakeStream):
    """The fake engine, and an entrance pass that keeps 1 group in `every`; it logs
    each submission and each drop, in order."""

    def __init__(self, seed: int, every: int, version: int = 0, slow: int = 4):
        super().__init__(seed, version, slow)
        self.every, self.log = every, []

    def call(self, method, *args, **kwargs):
        if method == "stream_submit":
            self.log += [("submit", str(u)) for u in args[0]["uid"]]
        return super().call(method, *args, **kwargs)

    def run_step(self, feeds, plan=None, skip=frozenset(), draw=None):
        """An entrance pass of its own (fed `FEED`), or a training pass, with the
        entrance inside it when fed `INSIDE` (its nodes then named `entrance/...`)."""
        if FEED in feeds:
            return self.screen(feeds[FEED])
        result = super().run_step({n: f for n, f in feeds.items() if n != INSIDE},
                                  plan, skip, draw)
        if INSIDE in feeds:
            self.joint.append((len(self.trained), feeds[INSIDE].shards[0][1]))
            inside = self.screen(feeds[INSIDE], ENTRANCE_PREFIX)
            result.outputs.update(inside.outputs)
            result.node_metrics.update(inside.node_metrics)
        return result

    def screen(self, feed, at: str = "") -> StepResult:
        rows = self.taken(feed)  # screened where they wait: left in the store
        uids = [str(u) for u in rows["uid"]]
        self.log += [("drop", u) for u in dict.fromkeys(uids) if dropped(u, self.every)]
        kept = rows.take([i for i, u in enumerate(uids) if not dropped(u, self.every)])
        return StepResult(outputs={at + "drop_uniform_groups": Shards([kept])},
                          node_metrics={at + "drop_uniform_groups": {
                              "dapo/dropped_groups_total": float(len(set(uids)) - len(
                                  set(kept["uid"])))}})

    def fetch(self, result, node, keys):
        return result.outputs[node].refs[0].select(*keys)



def run(k, seed, every=3, max_rounds=100, steps=range(1, STEPS + 1), state=None,
        background=False):
    """`background`: polled as an engine on its own thread is, here a fast one (its
    requests done by the next poll), so the next step's groups are whole before its
    pass and screened inside the training pass before it."""
    engine = FilteringStream(seed, every, version=steps[0] - 1, slow=1 if background else 4)
    sched = RunScheduler(engine, dapo_plan(k, max_rounds), Loader(), background=background)
    if state is not None:
        sched.load_state_dict(state, steps[0] - 1)
    results, states, filtered = {}, {}, {}
    for step in steps:
        results[step] = sched.step(step, STEPS)
        states[step] = sched.state_dict()
        filtered[step] = list(sched.source.last_filtered)
    return engine, sched, results, states, filtered


def _no_submit_after_drop(log: list, also_dropped: set = frozenset()) -> None:
    gone = set(also_dropped)
    for event, uid in log:
        assert not (event == "submit" and uid in gone), uid
        if event == "drop":
            gone.add(uid)


@pytest.mark.parametrize("background", [False, True])
@pytest.mark.parametrize("k", [1, 2])
@pytest.mark.parametrize("seed", range(3))
def test_dropped_groups_are_never_trained_nor_drawn_again_and_batches_fill(k, seed,
                                                                           background):
    engine, sched, results, _, filtered = run(k, seed, background=background)
    drops = [u for uids in filtered.values() for u in uids]
    trained = [u for uids in engine.trained for u in uids]
    assert all(len(uids) == SIZE for uids in engine.trained)  # each batch filled
    assert len(trained) == len(set(trained)) == STEPS * SIZE
    assert not set(drops) & set(trained) and all(not dropped(u, 3) for u in trained)
    assert len(drops) == len(set(drops)) == sched.source.filtered > 0
    _no_submit_after_drop(engine.log)
    # the gather's metrics, named as the pipelined gather names them: batches' worth
    # of groups dropped for the step, rows short of the batch
    assert sum(r.metrics["gather/extra_rounds"] for r in results.values()) * SIZE \
        == sched.source.filtered
    assert sum(r.metrics["dapo/dropped_groups_total"] for r in results.values()) \
        == sched.source.filtered  # the filter's own count, step by step
    assert sched.loader.served > STEPS * SIZE * 2  # more drawn in the dropped ones' place
    assert all(r.metrics["gather/short_rows"] == 0 for r in results.values())


def test_max_rounds_bounds_the_wait_with_a_short_batch_of_kept_groups():
    engine, sched, results, _, _ = run(1, 0, every=4, max_rounds=0)
    sizes = [len(uids) for uids in engine.trained]
    assert min(sizes) >= 1 and min(sizes) < SIZE, sizes
    shorts = [r.metrics["gather/short_rows"] for r in results.values()]
    assert shorts == [(SIZE - n) * N for n in sizes]
    trained = [u for uids in engine.trained for u in uids]
    assert len(trained) == len(set(trained)) and all(not dropped(u, 4) for u in trained)


@pytest.mark.parametrize("background", [False, True])
@pytest.mark.parametrize("k", [1, 2])
@pytest.mark.parametrize("save", range(1, STEPS))
def test_resume_with_filtering_trains_each_kept_prompt_once_and_never_redraws_a_drop(
        k, save, background):
    whole, _, _, states, filtered = run(k, 7, background=background)
    resumed, sched, _, _, filtered_after = run(k, 11, steps=range(save + 1, STEPS + 1),
                                               state=states[save], background=background)
    dropped_before = {u for s in range(1, save + 1) for u in filtered[s]}
    trained = [u for uids in whole.trained[:save] + resumed.trained for u in uids]
    assert len(trained) == len(set(trained)) == STEPS * SIZE
    _no_submit_after_drop(resumed.log, dropped_before)  # a drop stays consumed
    drops = dropped_before | {u for uids in filtered_after.values() for u in uids}
    assert not drops & set(trained)
    drawn = {f"u{i}" for i in range(sched.loader.served)}
    assert set(trained) | drops | set(sched.source.prompts) == drawn  # nothing drawn is lost


@pytest.mark.parametrize("seed", range(3))
def test_a_filter_inside_the_training_pass_screens_the_next_steps_groups(seed):
    """A fast engine on its own thread (k = 3, 1 group in 4 dropped; the lead counts
    prompts, so a filter that drops groups needs k > 2 to hold a step's kept groups
    ahead here): the groups whole
    before a pass are screened inside it, beside the update; the drops are counted
    with the step they are drawn again for (the next one), so each step's
    `gather/extra_rounds` and the filter's own count agree and add up to every drop;
    a dropped group is never trained nor drawn again."""
    engine, sched, results, _, filtered = run(3, seed, every=-4, background=True)
    assert engine.joint
    trained = [u for uids in engine.trained for u in uids]
    assert len(trained) == len(set(trained)) == STEPS * SIZE
    drops = [u for uids in filtered.values() for u in uids]
    assert drops and not set(drops) & set(trained)
    _no_submit_after_drop(engine.log)
    for r in results.values():
        assert r.metrics["gather/extra_rounds"] * SIZE == \
            r.metrics.get("dapo/dropped_groups_total", 0.0)
    assert sum(r.metrics["gather/extra_rounds"] for r in results.values()) * SIZE \
        == sched.source.filtered
