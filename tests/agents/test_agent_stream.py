"""The agent role's streaming calls (hybridflow/agents/stream.py) on the local runtime,
driven as the streaming scheduler drives them: submitted prompts are played n
episodes each, a poll at a time, whole episodes with one weights version per episode
(`token_versions` on every response token), prompts laid out data.max_prompt_length
wide so that polls concatenate; abort drops what was not played; a first observation
wider than the layout stops the run naming the key."""
import pytest
import torch
from agent_probe import probe_overrides as _overrides

from hybridflow.program.assemble import prepare
from hybridflow.run.loop import Trainer
from hybridflow.run.tracking import new_run_dir


@pytest.fixture
def agent(tmp_path):
    graph, args = _overrides(tmp_path)
    loaded = prepare(graph, [*args, "rollout.micro_batch_size=3"])
    trainer = Trainer(loaded, new_run_dir(str(tmp_path), loaded.graph.name))
    try:
        yield trainer
    finally:
        trainer.close()


def test_episodes_stream_whole_a_poll_at_a_time(agent):
    runtime, prompts = agent.runtime, agent.train_loader.next_batch()  # 4 prompts
    (queued,) = runtime.call_role("agent", "stream_submit", prompts, n=2)
    assert queued == {str(u): 2 for u in prompts["uid"]}
    polls, whole = [], []
    while True:
        (reply,) = runtime.call_role("agent", "stream_poll")
        if not reply["rows"]:
            break
        polls.append(reply["rows"])
        whole += list(reply["groups"])
        if not reply["busy"]:
            break
    assert polls == [3, 3, 2]  # rollout.micro_batch_size episodes a poll
    assert sorted(whole) == sorted(str(u) for u in prompts["uid"])  # each group once, whole
    # the rows waited on the worker; taken in any groups' order they concatenate
    (rows,) = runtime.call_role("agent", "stream_take", whole[::-1])
    assert rows["prompts"].shape[1] == 16  # prompts data.max_prompt_length wide
    assert rows["prompts"].shape[1] == 16
    assert sorted(rows["uid"]) == sorted(list(prompts["uid"]) * 2)
    real = rows["response_mask"].bool()
    versions = rows["policy_version"][:, None].expand_as(real)
    assert torch.equal(rows["token_versions"][real], versions[real])
    assert (rows["token_versions"][~real] == -1).all()
    assert reply["counts"] == {"episodes": 8, "polls": 3}


def test_abort_drops_the_episodes_not_played(agent):
    runtime, prompts = agent.runtime, agent.train_loader.next_batch()
    runtime.call_role("agent", "stream_submit", prompts, n=2)
    runtime.call_role("agent", "stream_poll")
    assert runtime.call_role("agent", "stream_abort") == [5]
    (reply,) = runtime.call_role("agent", "stream_poll")
    assert not reply["rows"] and not reply["groups"] and not reply["busy"]


def test_a_prompt_wider_than_the_layout_names_the_key(agent):
    (worker,) = agent.runtime.workers("agent")
    worker.prompt_width = 2
    agent.runtime.call_role("agent", "stream_submit", agent.train_loader.next_batch(), n=1)
    with pytest.raises(RuntimeError, match=r"data.max_prompt_length=2 tokens wide.*raise "
                                           r"data.max_prompt_length"):
        agent.runtime.call_role("agent", "stream_poll")
