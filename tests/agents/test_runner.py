"""EpisodeRunner: the generate/step loop over a batch, its concurrency, and how each
kind of bad input ends one episode (reward 0, a counted metric) without ending the
batch, unless the environment fails on every episode."""
import asyncio
import threading
import time

import pytest

from hybridflow.agents import (EnvironmentFailedError, EpisodeRunner, PlainFormat,
                               RunnerOptions, StepResult, ToolError)
from tests.support.agent_fakes import ContextGenerator, ScriptedEnv, scripted_rows


@pytest.fixture
def fmt(char_tokenizer):
    return PlainFormat(char_tokenizer)


@pytest.fixture
def generator(char_tokenizer):
    ids = char_tokenizer.convert_tokens_to_ids(list("abcdefgh"))
    return ContextGenerator(ids, char_tokenizer.eos_token_id, max_len=4, stop_probability=1.0)


def run(fmt, generator, rows, env=ScriptedEnv, **options):
    options.setdefault("step_timeout_s", 5.0)
    return EpisodeRunner(env, generator, fmt, RunnerOptions(**options), "scripted").run(rows)


def test_every_episode_runs_its_turns_and_sums_its_rewards(fmt, generator):
    rows = scripted_rows(12, seed=1, max_turns=3)
    result = run(fmt, generator, rows, max_turns=3)
    assert [e.status for e in result.episodes] == ["done"] * 12
    assert [e.trajectory.model_turns for e in result.episodes] == [r["turns"] for r in rows]
    assert [e.tool_calls for e in result.episodes] == [r["turns"] - 1 for r in rows]
    m = result.metrics
    assert m["agent/turns/mean"] == pytest.approx(sum(r["turns"] for r in rows) / 12)
    assert m["agent/tool_calls/mean"] == pytest.approx(sum(r["turns"] - 1 for r in rows) / 12)
    assert m["agent/reward/mean"] == 1.0
    assert m["agent/env_errors_total"] == m["agent/truncated_total"] == 0


class FlakyEnv(ScriptedEnv):
    """Misbehaves as row["fault"] says, at its first step."""

    def step(self, turn):
        fault = self.row.get("fault")
        if fault == "raise":
            raise RuntimeError("the simulator crashed")
        if fault == "hang":
            time.sleep(1.0)
        if fault == "garbage":
            return "not a step result"
        if fault == "nan":
            return StepResult(reward=float("nan"), done=True)
        if fault == "tool":
            raise ToolError("malformed call")
        return super().step(turn)


@pytest.mark.parametrize("fault,status,metric", [
    ("raise", "env_error", "agent/env_errors_total"),
    ("hang", "env_timeout", "agent/env_timeouts_total"),
    ("garbage", "env_error", "agent/env_errors_total"),
    ("nan", "env_error", "agent/env_errors_total"),
    ("tool", "tool_error", "agent/tool_errors_total")])
def test_a_faulty_episode_scores_zero_and_is_counted_and_the_batch_goes_on(
        fmt, generator, fault, status, metric):
    rows = scripted_rows(6, seed=2, max_turns=2)
    rows[3]["fault"] = fault
    result = run(fmt, generator, rows, env=FlakyEnv, step_timeout_s=0.3)
    assert result.episodes[3].status == status
    assert result.episodes[3].reward == 0.0
    assert result.metrics[metric] == 1
    assert [e.status for i, e in enumerate(result.episodes) if i != 3] == ["done"] * 5
    batch = result.to_batch(fmt.tokenizer.pad_token_id)
    assert batch["scores"].tolist() == [0.0 if i == 3 else 1.0 for i in range(6)]
    assert batch["agent_status"][3] == status


def test_an_environment_failing_on_every_episode_is_an_error_naming_it(fmt, generator):
    rows = [dict(r, fault="raise") for r in scripted_rows(4, seed=3)]
    with pytest.raises(EnvironmentFailedError, match=r"'scripted' failed on every one of the "
                       r"4 episodes .*RuntimeError: the simulator crashed"):
        run(fmt, generator, rows, env=FlakyEnv)


def test_tool_errors_on_every_episode_are_the_models_fault_not_an_error(fmt, generator):
    rows = [dict(r, fault="tool") for r in scripted_rows(4, seed=3)]
    assert run(fmt, generator, rows, env=FlakyEnv).metrics["agent/tool_errors_total"] == 4


def test_an_environment_that_cannot_be_built_or_reset_ends_its_episode(fmt, generator):
    class BadReset(ScriptedEnv):
        def reset(self, row):
            if row.get("bad"):
                return 42
            return super().reset(row)
    rows = scripted_rows(3, seed=4)
    rows[0]["bad"] = True
    result = run(fmt, generator, rows, env=BadReset)
    assert result.episodes[0].status == "env_error"
    assert "non-empty string" in result.episodes[0].error
    assert result.to_batch(0)["response_length"][0] == 0
    with pytest.raises(EnvironmentFailedError, match="building it raised ZeroDivisionError"):
        run(fmt, generator, rows, env=lambda: 1 / 0)
    with pytest.raises(EnvironmentFailedError, match="it built a int without reset and step"):
        run(fmt, generator, rows, env=lambda: 1)


def test_out_of_turns_or_tokens_is_truncated_with_reward_zero(fmt, generator):
    rows = [dict(r, turns=4) for r in scripted_rows(4, seed=5, max_turns=4)]
    by_turns = run(fmt, generator, rows, max_turns=2)
    assert [e.status for e in by_turns.episodes] == ["truncated"] * 4
    assert by_turns.metrics["agent/truncated_total"] == 4
    assert all(e.trajectory.model_turns == 2 for e in by_turns.episodes)
    by_tokens = run(fmt, generator, rows, max_turns=4, max_response_tokens=6)
    assert by_tokens.metrics["agent/truncated_total"] == 4
    assert all(len(e.trajectory) <= 6 and e.reward == 0 for e in by_tokens.episodes)


def test_a_turn_cut_by_its_token_limit_is_truncated(fmt, char_tokenizer):
    endless = ContextGenerator([char_tokenizer.convert_tokens_to_ids("a")],
                               char_tokenizer.eos_token_id, max_len=50, stop_probability=0.0)
    result = run(fmt, endless, scripted_rows(2, seed=6), max_turn_tokens=5)
    assert [len(e.trajectory) for e in result.episodes] == [5, 5]
    assert "hit its 5-token limit" in result.episodes[0].error


def test_async_environments_are_awaited(fmt, generator):
    class AsyncEnv(ScriptedEnv):
        async def step(self, turn):
            await asyncio.sleep(0.001)
            return ScriptedEnv.step(self, turn)
    result = run(fmt, generator, scripted_rows(5, seed=7), env=AsyncEnv)
    assert result.metrics["agent/reward/mean"] == 1.0


def test_episodes_waiting_on_their_environment_do_not_block_the_others(fmt, generator):
    """Episode 0's first step waits until every other episode has finished: only a
    runner that keeps generating for the others while it waits can finish at all."""
    rows = [dict(r, turns=3) for r in scripted_rows(5, seed=8, max_turns=3)]
    rows[0]["waits"] = True
    others_done, finished = threading.Event(), []

    class Waiting(ScriptedEnv):
        def step(self, turn):
            if self.row.get("waits") and not others_done.wait(timeout=3.0):
                raise TimeoutError("the others never finished")
            result = ScriptedEnv.step(self, turn)
            if result.done and not self.row.get("waits"):
                finished.append(1)
                if len(finished) == 4:
                    others_done.set()
            return result

    result = run(fmt, generator, rows, env=Waiting)
    assert [e.status for e in result.episodes] == ["done"] * 5
    others_done.clear()
    finished.clear()
    lockstep = run(fmt, generator, rows, env=Waiting, lockstep=True, step_timeout_s=0.5)
    assert lockstep.episodes[0].status == "env_timeout"  # the others waited on it


def test_lockstep_and_continuous_schedules_play_the_same_episodes(fmt, char_tokenizer):
    ids = char_tokenizer.convert_tokens_to_ids(list("abcdef"))
    rows = scripted_rows(16, seed=9, max_turns=4, latency_ms=(0, 5))
    results = [run(fmt, ContextGenerator(ids, char_tokenizer.eos_token_id, max_len=5,
                                         stop_probability=0.9), rows, lockstep=lockstep)
               for lockstep in (False, True)]
    assert [e.trajectory for e in results[0].episodes] == \
        [e.trajectory for e in results[1].episodes]
    assert [e.status for e in results[0].episodes] == [e.status for e in results[1].episodes]


def test_max_active_and_max_batch_rows_bound_the_work_in_flight(fmt, generator):
    active, peak = set(), []

    class Counting(ScriptedEnv):
        def reset(self, row):
            active.add(id(self))
            peak.append(len(active))
            return super().reset(row)

        def step(self, turn):
            result = super().step(turn)
            if result.done:
                active.discard(id(self))
            return result

    sizes = []

    def generate(contexts, max_new_tokens):
        sizes.append(len(contexts))
        return generator(contexts, max_new_tokens)

    result = run(fmt, generate, scripted_rows(20, seed=10), env=Counting, max_active=4,
                 max_batch_rows=3)
    assert [e.status for e in result.episodes] == ["done"] * 20
    assert max(peak) <= 4 and max(sizes) <= 3


def test_a_generator_returning_the_wrong_number_of_turns_is_an_error(fmt):
    with pytest.raises(TypeError, match="one GeneratedTurn each"):
        run(fmt, lambda contexts, n: [], scripted_rows(2, seed=11))


def test_options_are_checked():
    with pytest.raises(ValueError, match="max_turns must be >= 1"):
        RunnerOptions(max_turns=0)
    with pytest.raises(ValueError, match="step_timeout_s must be > 0"):
        RunnerOptions(step_timeout_s=0)


def test_no_rows_is_an_empty_result_not_an_error(fmt, generator):
    result = run(fmt, generator, [])
    assert result.episodes == [] and result.metrics["agent/episodes_total"] == 0
