"""What a batch of episodes yields: the score at the last model token, statuses,
and an empty batch that is still a batch."""
from hybridflow.agents import Episode, RolloutResult, Trajectory


def test_the_score_sits_at_the_last_model_token_and_failures_score_zero():
    done = Trajectory([1, 2])
    done.add_model_turn([3, 4])
    done.add_observation([5, 6])
    done.add_model_turn([7])
    done.add_observation([8])  # never happens at the end of a real episode; still masked
    failed = Trajectory([1])
    failed.add_model_turn([9])
    episodes = [Episode(0, {}, trajectory=done, reward=2.5), Episode(1, {}, trajectory=failed,
                                                                     reward=1.0)]
    episodes[0].finish("done")
    episodes[1].finish("tool_error", "malformed")
    result = RolloutResult(episodes)
    batch = result.to_batch(pad_id=0)
    assert batch["token_level_scores"].tolist() == [[0, 0, 0, 0, 2.5, 0], [0] * 6]
    assert batch["scores"].tolist() == [2.5, 0.0]
    assert list(batch["agent_status"]) == ["done", "tool_error"]
    metrics = result.compute_metrics()
    assert metrics["agent/tool_errors_total"] == 1 and metrics["agent/turns/mean"] == 1.5


def test_an_empty_batch_is_an_empty_rollout():
    result = RolloutResult([])
    assert result.compute_metrics()["agent/episodes_total"] == 0
    assert len(result.to_batch(pad_id=0)) == 0
