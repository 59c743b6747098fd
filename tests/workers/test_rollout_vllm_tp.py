"""The vLLM engine over a tensor-parallel group (vllm_group.py), against the fake `LLM`
(tests/support/vllm_fakes.py) and a fake group all-gather: what each rank builds, what
is refused before vLLM starts, the agreement before vLLM's collectives, and the rollout
role's streaming calls on a tp group. tests/workers/test_vllm_tp_real.py runs real vLLM
at tp=2 against tp=1."""
import pytest
import torch

from hybridflow.core.layout import RoleLayout
from hybridflow.workers.base import WorkerContext
from hybridflow.workers.config import ModelConfig, RolloutConfig, read_section
from hybridflow.workers.rollout.engine import EngineSpec, engine_supports_tp
from hybridflow.workers.rollout.generation import sampling_options
from hybridflow.workers.rollout.vllm import make_vllm_engine
from hybridflow.workers.rollout.vllm_group import bind_env, check_group, core_list
from hybridflow.workers.tokenizer import load_tokenizer, tokenizer_spec
from tests.support.vllm_fakes import FAKE_RELOAD, FakeLLM, FakeParams
from tests.support.workers import PROMPTS, make_cfg, prompt_batch


class Group:
    """A fake tp group's all-gather: this rank's value and what the peers hold."""

    def __init__(self, peers=()):
        self.peers, self.calls = list(peers), []

    def __call__(self, value):
        self.calls.append(value)
        return [value] + [value if p is None else p for p in self.peers]


def _spec(rank=0, world=2, tp=2, **hf):
    cfg = make_cfg(rollout={"backend": "vllm"})
    cfg["model"]["hf_config"].update(hf)
    model_cfg = read_section(cfg, "model", ModelConfig)
    return EngineSpec(model_cfg, read_section(cfg, "rollout", RolloutConfig),
                      load_tokenizer(tokenizer_spec(model_cfg)),
                      WorkerContext(rank=rank, world_size=world, local_rank=rank, seed=10),
                      torch.device("cpu"), tp=tp)


def _engine(group=None, **kw):
    return make_vllm_engine(_spec(**kw), FakeLLM, FakeParams, FAKE_RELOAD,
                            agree_fn=group or Group([None]))


def test_the_vllm_engine_registers_tensor_parallel():
    assert engine_supports_tp("vllm")


@pytest.mark.parametrize("rank", [0, 1, 2, 3])
def test_each_rank_builds_vllm_at_the_groups_tp_with_the_groups_seed(rank):
    engine = _engine(rank=rank, world=4)
    assert engine.llm.kwargs["tensor_parallel_size"] == 2 and engine.tp == 2
    assert engine.llm.kwargs["distributed_executor_backend"] == "external_launcher"
    assert engine.seed == 10 + rank // 2  # one seed per tp group: ranks 0,1 and 2,3


def test_tp1_keeps_a_seed_per_rank():
    assert _engine(rank=1, world=2, tp=1).seed == 11


@pytest.mark.parametrize("hf,tp,match", [
    ({}, 3, r"tp=3 does not divide the role's 2 rank"),
    ({"num_attention_heads": 4, "num_key_value_heads": 1}, 2,
     r"placement.parallel.rollout.tp=2: model.hf_config has 4 attention heads and 1 "
     r"key/value heads.*allowed: 1\)"),
    ({"num_attention_heads": 6, "num_key_value_heads": 6, "hidden_size": 48}, 4,
     r"tp=4: .*6 attention heads.*allowed: 1, 2, 3, 6"),
])
def test_a_tp_the_model_or_the_ranks_cannot_split_is_refused_before_vllm(hf, tp, match):
    with pytest.raises(ValueError, match=match):
        _engine(world=max(tp, 2) if tp != 3 else 2, tp=tp, **hf)


def test_a_tp_above_the_cores_to_bind_is_refused():
    with pytest.raises(ValueError, match=r"tp=2: .*1 core\(s\) \(\[3\]\); use tp <= 1"):
        check_group(_spec(), 2, allowed={3})


def test_each_rank_of_a_group_gets_cores_of_its_own():
    cores = set(range(8))
    assert [core_list(2, r, r, 2, cores) for r in range(2)] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert [core_list(4, r, r, 2, {0, 1}) for r in range(4)] == [[0], [1], [0], [1]]
    assert [core_list(4, r, r, 2, cores) for r in range(4)] == [[0, 1], [2, 3], [4, 5],
                                                                 [6, 7]]
    ctx = WorkerContext(rank=3, world_size=4, local_rank=3)
    assert bind_env(ctx, 2, {0, 1}) == {"VLLM_CPU_OMP_THREADS_BIND": "0|1"}
    assert bind_env(ctx, 2, cores) == {"VLLM_CPU_OMP_THREADS_BIND": "4,5|6,7"}


def _batch(spec):
    return prompt_batch(spec.tokenizer, PROMPTS).select("input_ids", "attention_mask")


def test_a_group_whose_ranks_got_different_rows_refuses_to_generate():
    spec = _spec()
    opts = sampling_options(spec.rollout_cfg, n=1)
    agreeing = _engine()
    assert len(agreeing.generate(_batch(spec), opts)) == len(PROMPTS)
    other = Group([12345])  # the peer's digest differs: other rows or other weights
    with pytest.raises(RuntimeError, match=r"tp=2: the ranks of one tp group .*same rows"):
        _engine(group=other).generate(_batch(spec), opts)
    assert ("generate", len(PROMPTS)) not in _engine(group=other).llm.calls


def test_a_bucket_one_rank_did_not_load_is_seen_before_generating():
    """The digest covers the buckets' names and shapes: a rank that missed one differs."""
    first, second = _engine(), _engine()
    first.load_weights([("a", torch.zeros(2, 3))])
    first.finish_weight_update(1)
    second.load_weights([("a", torch.zeros(3, 2))])
    second.finish_weight_update(1)
    assert first.policy_version == second.policy_version and first.loaded != second.loaded


def test_a_poll_steps_only_when_the_group_agrees():
    spec = _spec()
    opts = sampling_options(spec.rollout_cfg, n=1, do_sample=False, max_new_tokens=4)
    group = Group([None])
    engine = _engine(group=group)
    engine.submit(prompt_batch(spec.tokenizer, PROMPTS), opts)
    group.peers = [7]  # the peer has not received this submit yet
    assert engine.poll(2) is None and engine.stream_counts()["decode_steps"] == 0
    group.peers = [None]
    while engine.stream_busy:
        engine.poll(2)
    assert engine.stream_counts()["decode_steps"] > 0


class _GroupEngine:
    """A streaming engine of a tp=2 group, recording what it was given."""
    tp, stream_busy = 2, False

    def __init__(self):
        self.submitted = []

    def submit(self, rows, opts):
        self.submitted += list(rows["uid"])

    def poll(self, steps):
        return prompt_batch_of(self.submitted)

    def stream_counts(self):
        return {}

    def abort(self):
        return 0


def prompt_batch_of(uids):
    from hybridflow.core.batch import Batch
    zeros = torch.zeros(len(uids), dtype=torch.long)
    return Batch({"x": torch.zeros(len(uids), 1), "policy_version": zeros,
                  "token_versions": zeros[:, None]}, {"uid": list(uids)})


@pytest.mark.parametrize("rank", [0, 1, 2, 3])
def test_streaming_calls_give_a_tp_group_one_share_and_one_report(rank):
    """The driver sends each tp group its share (runtime/run_long/stream_client.py: prompt i to
    group i mod 2); every rank of the group queues it, only the first reports and
    keeps the rows."""
    from hybridflow.runtime.run_long.stream_client import StreamClient
    from hybridflow.workers import RolloutWorker
    worker = RolloutWorker(make_cfg(rollout={"backend": "vllm"}),
                           WorkerContext(rank=rank, world_size=4, local_rank=rank))
    worker._engine = _GroupEngine()
    batch = prompt_batch(load_tokenizer(tokenizer_spec(worker.model_cfg)), PROMPTS)
    sent = []
    client = StreamClient.__new__(StreamClient)
    client.world, client.layout, client.home, client.bytes = 4, RoleLayout(4, 2), {}, 0
    client.runtime = _Recorder(sent)
    client.role, client.gen = "rollout", None
    client.submit(batch, n=2)
    share = sent[rank]
    group = rank // 2
    mine = [u for i, u in enumerate(batch["uid"]) if i % 2 == group]
    assert list(share["uid"]) == mine  # a prompt goes to the ranks that generate it only
    counts = worker.stream_submit(share, n=2)
    assert worker._engine.submitted == [u for u in mine for _ in range(2)]
    assert counts == ({u: 2 for u in mine} if rank % 2 == 0 else {})
    reply = worker.stream_poll()
    assert (not reply["groups"]) == (rank % 2 == 1)
    assert worker.stream_start() is False  # a tp group steps inline, never on a thread


class _Recorder:
    """The runtime surface a StreamClient calls: records each rank's submitted rows."""

    def __init__(self, sent):
        self.sent = sent

    def call_each(self, role, method, args_by_rank, **kwargs):
        self.sent += [a[0] for a in args_by_rank]
        return [{} for _ in args_by_rank]

    def value_bytes(self, value):
        return 0


def test_a_rank_unlinks_only_its_own_shared_memory_names(tmp_path):
    from hybridflow.workers.rollout.vllm_group import unlink_shm_names
    names = ["123-tp:0-[0-1]-cpushm_0", "123-tp:0-[0-1]-cpushm_1", "123-tp:0-[2-3]-cpushm_0",
             "999-tp:0-[0-1]-cpushm_1", "psm_1234"]
    for name in names:
        (tmp_path / name).write_bytes(b"")
    assert unlink_shm_names(1, "123", str(tmp_path)) == ["123-tp:0-[0-1]-cpushm_1"]
    assert unlink_shm_names(2, "123", str(tmp_path)) == ["123-tp:0-[2-3]-cpushm_0"]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        set(names) - {"123-tp:0-[0-1]-cpushm_1", "123-tp:0-[2-3]-cpushm_0"})
