"""Ulysses attention (workers/parallel/ulysses.py) on 2 gloo ranks equals the unsplit
attention: each rank holds half the positions of q, k, v (4 heads, 2 key/value heads),
the heads are exchanged by all-to-all around the model's own attention, and the
outputs and the gradients of q, k, v at each rank's positions equal one process's
whole-sequence attention to 1e-5 (fp32): sdpa and eager with left padding, and packed
rows through the varlen sdpa (offsets global, a run crossing the ranks' boundary)."""
import os

import pytest
import torch
import torch.multiprocessing as mp

from tests.support.workers import TINY, leave_process_group
from tests.support.ports import free_port

pytestmark = pytest.mark.slow  # spawns two gloo ranks

B, H, KV, S, D = 2, 4, 2, 10, 8
CASES = ("sdpa", "eager", "sdpa_varlen")


def _module(inner: str):
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaAttention
    config = LlamaConfig(**{k: v for k, v in TINY.items() if k != "model_type"},
                         head_dim=D, attn_implementation=inner if inner != "sdpa_varlen"
                         else "sdpa")
    return LlamaAttention(config, layer_idx=0).eval()


def _inputs(inner: str):
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1 if inner == "sdpa_varlen" else B, h, S, D, generator=gen)
               for h in (H, KV, KV))
    upstream = torch.randn(q.shape[0], S, H, D, generator=gen)
    if inner == "sdpa_varlen":  # three packed rows, one crossing the middle (5)
        offsets = torch.tensor([0, 3, 8, 10], dtype=torch.int32)
        positions = torch.cat([torch.arange(e - s) for s, e in zip([0, 3, 8], [3, 8, 10])])
        return q, k, v, upstream, None, positions.unsqueeze(0), offsets
    mask = torch.ones(B, S, dtype=torch.long)
    mask[1, :3] = 0  # left padding in the second row
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    return q, k, v, upstream, mask, positions, None


def _whole(inner: str):
    """One process's attention over the whole sequence, and the gradients of q, k, v."""
    from transformers.masking_utils import create_causal_mask
    from hybridflow.workers.parallel.ulysses import _inner_function
    module = _module(inner)
    q, k, v, upstream, mask, positions, offsets = _inputs(inner)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    config = module.config
    config._attn_implementation = "sdpa" if inner == "sdpa_varlen" else inner
    full = create_causal_mask(config=config, inputs_embeds=q.new_empty(q.shape[0], S, 0),
                              attention_mask=mask, cache=None, position_ids=positions)
    extra = {"cu_seq_lens_q": offsets, "cu_seq_lens_k": offsets} if offsets is not None else {}
    out, _ = _inner_function(module, inner)(module, q, k, v, full, scaling=D ** -0.5, **extra)
    (out * upstream).sum().backward()
    return out.detach(), [t.grad for t in (q, k, v)], mask


def _rank_main(rank: int, world: int, port: int, out_dir: str):
    import torch.distributed as dist
    from hybridflow.workers.parallel.ulysses import SequenceSplit, register_ulysses
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    results, half = {}, slice(rank * S // 2, (rank + 1) * S // 2)
    for inner in CASES:
        module = _module(inner)
        q, k, v, upstream, mask, positions, offsets = _inputs(inner)
        q, k, v = (t[:, :, half].clone().requires_grad_() for t in (q, k, v))
        split = SequenceSplit(None, world, rank, S, mask, positions, offsets)
        attend = ALL_ATTENTION_FUNCTIONS[register_ulysses(inner)]
        out, _ = attend(module, q, k, v, None, scaling=D ** -0.5, sequence_split=split)
        (out * upstream[:, half]).sum().backward()
        results[inner] = (out.detach(), [t.grad for t in (q, k, v)])
    torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))
    leave_process_group(rank, out_dir)


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    out = tmp_path_factory.mktemp("ulysses")
    mp.spawn(_rank_main, args=(2, free_port(), str(out)), nprocs=2, join=True)
    return [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(2)]


@pytest.mark.parametrize("inner", CASES)
def test_ulysses_attention_equals_the_whole_sequence(ranks, inner):
    want, grads, mask = _whole(inner)
    for rank, results in enumerate(ranks):
        half = slice(rank * S // 2, (rank + 1) * S // 2)
        out, got_grads = results[inner]
        real = (mask[:, half].bool() if mask is not None
                else torch.ones(out.shape[:2], dtype=torch.bool))  # padded queries aside
        assert out.shape == want[:, half].shape
        assert torch.allclose(out[real], want[:, half][real], atol=1e-5, rtol=0), \
            f"{inner} rank {rank}: {(out[real] - want[:, half][real]).abs().max()}"
        for name, got, whole in zip("qkv", got_grads, grads):
            whole = whole[:, :, half]
            assert torch.allclose(got, whole, atol=1e-5, rtol=0), \
                f"{inner} rank {rank} grad {name}: {(got - whole).abs().max()}"
