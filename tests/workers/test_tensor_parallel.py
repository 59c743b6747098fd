"""Tensor parallelism on the CPU (2 gloo ranks, one tp group, `placement.parallel.<role>.tp=2`):
from the same weights, the sharded actor's log-probs, entropy, gradients and one update,
the reference's log-probs and the critic's values and update equal one unsharded rank's
to 1e-5 in fp32, on the toy Llama (graphs/assets/toy_base), a tiny Qwen2 (padded and
packed) and a tiny Llama with a tied head; the embedding, the head and its logits really
are sharded (a tied weight once); and the
hf engine generates on the sharded actor in lockstep (greedy tokens equal, sampled
tokens equal over the group)."""
import os

import pytest
import torch
import torch.multiprocessing as mp

from tests.support.workers import QWEN2, TINY, leave_process_group, make_cfg, prompt_batch
from tests.support.workers import ADAM_STEP_ATOL, rollout_for_update
from tests.support.ports import free_port
from hybridflow.workers import ActorWorker, CriticWorker, ReferenceWorker, WorkerContext
from hybridflow.workers.sequences import forward_response, response_logits
from hybridflow.workers.parallel.vocab_parallel import is_vocab_sharded

pytestmark = pytest.mark.slow  # two gloo ranks build and train three models (~60 s)

TOY = os.path.join(os.path.dirname(__file__), "..", "..", "graphs", "assets", "toy_base")
# lr 1e-3: AdamW's first step is lr * g / (|g| + eps), about lr * sign(g), so a gradient
# entry near 0 moves its weight by up to lr on float32 noise alone; gradients are compared
# directly (`_grads`) and by their norm, which AdamW's step does not show
TRAIN = {"lr": 1e-3, "ppo_epochs": 1, "entropy_coeff": 0.01, "use_kl_loss": True,
         "mini_batch_size": 8, "micro_batch_size": 4, "strategy": "fsdp2"}
CRITIC = {"lr": 1e-3, "mini_batch_size": 8, "micro_batch_size": 4, "strategy": "fsdp2"}


def _cfg(model: dict) -> dict:
    cfg = make_cfg(actor=TRAIN, critic=CRITIC)
    cfg["model"] = {**cfg["model"], **model}
    return cfg


CASES = {
    "toy_llama": _cfg({"path": os.path.abspath(TOY), "hf_config": {}}),
    "qwen2": _cfg({"hf_config": dict(QWEN2)}),
    "tied_llama": _cfg({"hf_config": {**TINY, "tie_word_embeddings": True}}),
    "packed_qwen2": _cfg({"hf_config": dict(QWEN2), "use_remove_padding": True}),
}


def _whole(t: torch.Tensor) -> torch.Tensor:
    return (t.full_tensor() if hasattr(t, "full_tensor") else t).detach().clone()


def _grads(module, batch) -> dict:
    """Gradients of masked log-probs plus entropy (a loss reading both) per parameter."""
    module.zero_grad(set_to_none=True)
    logp, ent = forward_response(module, batch, 1.0, with_entropy=True)
    mask = batch["response_mask"].float()
    (((logp + 0.1 * ent) * mask).sum() / mask.sum()).backward()  # a token-mean loss
    grads = {n: _whole(p.grad) for n, p in module.named_parameters() if p.grad is not None}
    module.zero_grad(set_to_none=True)
    return grads


def _sharding(actor, batch) -> dict:
    module = actor.module
    logits = response_logits(module, batch)  # what the log-probs and entropy read
    embed, head = module.get_input_embeddings(), module.get_output_embeddings()
    local = embed.weight.to_local() if hasattr(embed.weight, "to_local") else embed.weight
    return {"embed_rows": local.shape[0], "vocab": embed.weight.shape[0],
            "tied": head.weight is embed.weight, "vocab_sharded": is_vocab_sharded(logits),
            "local_logits": logits.to_local().shape[-1],
            "q_local": module.model.layers[0].self_attn.q_proj.weight.to_local().shape[0]}


def _run(cfg: dict, batch, ctx=None) -> dict:
    """Everything compared, on one rank (ctx None) or a rank of the tp group."""
    actor = ActorWorker(cfg, ctx)
    out = {"logp_ent": forward_response(actor.module, batch, 0.7, with_entropy=True),
           "logprob": actor.logprob(batch, with_entropy=True),
           "grads": _grads(actor.module, batch), "ref": ReferenceWorker(cfg, ctx).logprob(batch)}
    out["logp_ent"] = tuple(t.detach() for t in out["logp_ent"])
    prompts = prompt_batch(actor.tokenizer, ["1+2=", "7*8="])
    out["greedy"] = actor.generate(prompts, n=1, do_sample=False)["responses"]
    torch.manual_seed(7)
    out["sampled"] = actor.generate(prompts, n=2, do_sample=True)["responses"]
    out["update"] = actor.update(batch).meta["metrics"]
    out["weights"] = {n: _whole(p) for n, p in actor.module.named_parameters()}
    if ctx is not None:
        out["sharding"] = _sharding(actor, batch)
    critic = CriticWorker(cfg, ctx)
    values = critic.values(batch)
    data = batch.union(values)
    data["returns"] = 0.5 * data["response_mask"].float()
    out["values"] = values["values"]
    out["critic_update"] = critic.update(data).meta["metrics"]
    out["critic_weights"] = {n: _whole(p) for n, p in critic.module.named_parameters()}
    return out


def _rank_main(rank: int, world: int, port: int, batches: dict, out_dir: str):
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    ctx = WorkerContext(rank=rank, world_size=world, local_rank=rank, device="cpu", tp=world)
    results = {name: _run(cfg, batches[name], ctx) for name, cfg in CASES.items()}
    torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))
    leave_process_group(rank, out_dir)


@pytest.fixture(scope="module")
def tp_results(tmp_path_factory):
    torch.set_num_threads(1)
    out = tmp_path_factory.mktemp("tp")
    batches = {name: rollout_for_update(ActorWorker(cfg), n=2) for name, cfg in CASES.items()}
    single = {name: _run(cfg, batches[name]) for name, cfg in CASES.items()}
    mp.spawn(_rank_main, args=(2, free_port(), batches, str(out)), nprocs=2, join=True)
    ranks = [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(2)]
    return single, ranks


def _close(a: torch.Tensor, b: torch.Tensor, what: str, atol: float = 1e-5):
    assert a.shape == b.shape, what
    assert torch.allclose(a, b, atol=atol, rtol=0), f"{what}: {(a - b).abs().max()}"


@pytest.mark.parametrize("name", list(CASES))
def test_sharded_log_probs_and_entropy_equal_one_rank(tp_results, name):
    single, ranks = tp_results
    for rank in ranks:
        for i, what in enumerate(("log-probs", "entropy")):
            _close(rank[name]["logp_ent"][i], single[name]["logp_ent"][i], what)
        _close(rank[name]["logprob"]["old_log_probs"], single[name]["logprob"]["old_log_probs"],
               "actor.logprob")
        _close(rank[name]["ref"]["ref_log_prob"], single[name]["ref"]["ref_log_prob"], "ref")
        assert rank[name]["logprob"].meta["metrics"]["actor/entropy"] == pytest.approx(
            single[name]["logprob"].meta["metrics"]["actor/entropy"], abs=1e-5)


@pytest.mark.parametrize("name", list(CASES))
def test_sharded_gradients_equal_one_rank(tp_results, name):
    """Every parameter's gradient, the sharded embedding and head included: not
    averaged (nor summed) over the tp ranks."""
    single, ranks = tp_results
    grads = single[name]["grads"]
    for rank in ranks:
        assert set(rank[name]["grads"]) == set(grads)
        for key, value in grads.items():  # 1e-5 of the largest entry (float32 sums)
            _close(rank[name]["grads"][key], value, key,
                   atol=1e-5 * max(1.0, float(value.abs().max())))


@pytest.mark.parametrize("name", list(CASES))
def test_one_sharded_update_makes_the_one_rank_weights(tp_results, name):
    single, ranks = tp_results
    for rank in ranks:
        for key, value in single[name]["weights"].items():
            _close(rank[name]["weights"][key], value, key, atol=ADAM_STEP_ATOL)
        for key in ("actor/pg_loss", "actor/kl_loss", "actor/entropy", "actor/grad_norm"):
            assert rank[name]["update"][key] == pytest.approx(
                single[name]["update"][key], rel=1e-5, abs=1e-6), key


@pytest.mark.parametrize("name", list(CASES))
def test_sharded_critic_values_and_update_equal_one_rank(tp_results, name):
    single, ranks = tp_results
    for rank in ranks:
        _close(rank[name]["values"], single[name]["values"], "values")
        for key, value in single[name]["critic_weights"].items():
            _close(rank[name]["critic_weights"][key], value, key)
        assert rank[name]["critic_update"]["critic/grad_norm"] == pytest.approx(
            single[name]["critic_update"]["critic/grad_norm"], rel=1e-5)


@pytest.mark.parametrize("name", list(CASES))
def test_embedding_and_head_are_sharded_once(tp_results, name):
    _, ranks = tp_results
    shape = ranks[0][name]["sharding"]
    assert shape["embed_rows"] * 2 == shape["vocab"]  # half the vocabulary per rank
    assert shape["tied"] == (name == "tied_llama")  # a tied head reuses the shard
    # the head's logits stay split: no rank holds the whole vocabulary's
    assert shape["vocab_sharded"] and shape["local_logits"] * 2 == shape["vocab"]
    weights = ranks[0][name]["weights"]
    assert shape["q_local"] * 2 == weights["model.layers.0.self_attn.q_proj.weight"].shape[0]


@pytest.mark.parametrize("name", list(CASES))
def test_hf_engine_generates_on_the_sharded_actor(tp_results, name):
    """Greedy tokens equal one rank's; sampled tokens are the same on both ranks of
    the group (one seed per data-parallel rank, whole logits)."""
    single, ranks = tp_results
    assert torch.equal(ranks[0][name]["greedy"], single[name]["greedy"])
    assert torch.equal(ranks[0][name]["sampled"], ranks[1][name]["sampled"])
