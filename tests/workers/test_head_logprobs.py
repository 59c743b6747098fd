"""The chunked head's autograd Function (workers/head_logprobs.py): its hand-written
backward is the true gradient (gradcheck in float64, with a bias, a temperature, a chunk
that divides nothing, for log-probs, entropy and both); in float32 its values and
gradients equal autograd's over whole logits to 1e-6, an entropy read only as a metric
included; under bfloat16 autocast it is no less accurate than the checkpointed path it
replaces; its backward runs one head matmul per chunk besides the two gradient ones and
less than half the checkpointed path's vocabulary-wide ops; only a plain linear head
with plain-tensor weights takes it."""
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import hybridflow.workers.chunked_logprobs as chunked_logprobs
from hybridflow.workers.head_logprobs import fused_head, head_token_stats

VOCAB, WIDTH, POSITIONS, CHUNK = 23, 6, 10, 4  # 4 divides neither 10 nor 23


def _case(dtype=torch.float64, bias=True, seed=0):
    torch.manual_seed(seed)
    head = torch.nn.Linear(WIDTH, VOCAB, bias=bias).to(dtype)
    hidden = torch.randn(POSITIONS, WIDTH, dtype=dtype, requires_grad=True)
    tokens = torch.randint(0, VOCAB, (POSITIONS,))
    return head, hidden, tokens


def _whole(head, hidden, tokens, temperature):
    """Autograd over whole logits: the reference."""
    log_p = (head(hidden).float() / temperature).log_softmax(-1)
    chosen = log_p.gather(-1, tokens[:, None]).squeeze(-1)
    return chosen, -(log_p.exp() * log_p).sum(-1)


def _linear_with(weight, bias):
    """A linear head whose weight (and bias) are the given tensors, as gradcheck's inputs."""
    linear = torch.nn.Linear(WIDTH, VOCAB, bias=False)
    del linear.weight, linear.bias
    linear.weight, linear.bias = weight, bias
    return linear


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("outputs", ["log_probs", "entropy", "both"])
def test_gradcheck_float64(outputs, bias):
    head, hidden, tokens = _case(bias=bias)
    weight = head.weight.detach().clone().requires_grad_()
    extra = (head.bias.detach().clone().requires_grad_(),) if bias else ()

    def stats(hidden, weight, *bias_):
        linear = _linear_with(weight, bias_[0] if bias_ else None)
        log_p, ent = head_token_stats(linear, hidden, tokens, CHUNK, 0.7, True)
        return {"log_probs": (log_p,), "entropy": (ent,), "both": (log_p, ent)}[outputs]

    assert torch.autograd.gradcheck(stats, (hidden, weight) + extra)


@pytest.mark.parametrize("entropy_grad", [True, False])
def test_float32_equals_autograd_over_whole_logits(entropy_grad):
    """Log-probs, entropy and the gradients of h, W and b; with `entropy_grad=False` the
    entropy is a metric (detached) and the gradient is the log-probs' alone."""
    got, want = [], []
    for out in (got, want):
        head, hidden, tokens = _case(torch.float32)
        if out is got:
            log_p, ent = head_token_stats(head, hidden, tokens, CHUNK, 0.7, True)
        else:
            log_p, ent = _whole(head, hidden, tokens, 0.7)
        weights = torch.linspace(-1, 1, POSITIONS)
        loss = (weights * log_p).sum() + (0.3 * ent.sum() if entropy_grad else 0)
        loss.backward()
        out += [log_p.detach(), ent.detach(), hidden.grad, head.weight.grad, head.bias.grad]
    for a, b, what in zip(got, want, ("log-probs", "entropy", "grad h", "grad W", "grad b")):
        assert torch.allclose(a, b, atol=1e-6, rtol=0), f"{what}: {(a - b).abs().max()}"


def test_without_gradient_equals_with():
    head, hidden, tokens = _case(torch.float32)
    with torch.no_grad():
        plain = head_token_stats(head, hidden, tokens, CHUNK, 1.3, True)
    tracked = head_token_stats(head, hidden, tokens, CHUNK, 1.3, True)
    for a, b in zip(plain, tracked):
        assert torch.equal(a, b.detach())
    assert head_token_stats(head, hidden, tokens, CHUNK)[1] is None


def test_bfloat16_autocast_no_less_accurate_than_the_checkpointed_path(monkeypatch):
    """Under autocast the head runs in bfloat16 in both paths: equal log-probs, and
    gradients at least as close to the float64 truth as the checkpointed path's."""
    def run(fused: bool):
        monkeypatch.setattr(chunked_logprobs, "fused_head", lambda head, _fused=fused: _fused)
        head, hidden, tokens = _case(torch.float32)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            log_p, ent = chunked_logprobs.chunked_token_stats(head, hidden, tokens, CHUNK,
                                                              0.7, True)
        (log_p.sum() + 0.1 * ent.sum()).backward()
        return log_p.detach(), hidden.grad, head.weight.grad, head.bias.grad

    fused, checkpointed = run(True), run(False)
    head, hidden, tokens = _case(torch.float32)  # the same draws, then in float64
    hidden = hidden.detach().double().requires_grad_()
    log_p, ent = _whole(head.double(), hidden, tokens, 0.7)
    (log_p.sum() + 0.1 * ent.sum()).backward()
    truth = (hidden.grad, head.weight.grad, head.bias.grad)
    assert torch.equal(fused[0], checkpointed[0])
    for got, old, true in zip(fused[1:], checkpointed[1:], truth):
        assert got.dtype == torch.float32
        error, old_error = ((t.double() - true).abs().max() for t in (got, old))
        assert error <= old_error * 1.01 and error < 0.05, (error, old_error)


class _HeadOps(TorchDispatchMode):
    """Matrix products with the head's vocabulary dimension, and ops whose output is
    vocabulary-wide ([..., V]: a chunk's logits or their gradient)."""

    def __init__(self):
        super().__init__()
        self.matmuls = self.vocabulary_wide = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func.overloadpacket in (torch.ops.aten.mm, torch.ops.aten.addmm,
                                   torch.ops.aten.addmm_):
            self.matmuls += any(torch.is_tensor(a) and VOCAB in a.shape for a in args)
        outs = out if isinstance(out, (tuple, list)) else (out,)
        self.vocabulary_wide += any(torch.is_tensor(t) and t.dim() == 2 and t.shape[-1] == VOCAB
                                    for t in outs)
        return out


@pytest.mark.parametrize("entropy_grad", [True, False])
def test_backward_recomputes_one_head_matmul_and_no_autograd_graph(entropy_grad, monkeypatch):
    """Backward, a chunk: the recomputed logits, grad h and grad W (3 head matmuls), and
    under half the vocabulary-wide ops of the checkpointed path (which recomputes the
    log-softmax and the entropy and runs their autograd backward), the entropy a loss
    term or a metric."""
    chunks, seen = -(-POSITIONS // CHUNK), {}
    for fused in (True, False):
        monkeypatch.setattr(chunked_logprobs, "fused_head", lambda head, _fused=fused: _fused)
        head, hidden, tokens = _case(torch.float32)
        with _HeadOps() as forward:
            log_p, ent = chunked_logprobs.chunked_token_stats(head, hidden, tokens, CHUNK,
                                                              0.7, True)
        with _HeadOps() as backward:
            (log_p.sum() + (ent if entropy_grad else ent.detach()).sum()).backward()
        seen[fused] = forward, backward
    forward, backward = seen[True]
    assert forward.matmuls == chunks and backward.matmuls == 3 * chunks
    assert backward.vocabulary_wide < seen[False][1].vocabulary_wide / 2


def test_only_a_plain_linear_head_is_fused():
    head = torch.nn.Linear(4, 8)
    assert fused_head(head)

    class Adapted(torch.nn.Linear):  # a forward of its own (LoRA's adds a delta)
        def forward(self, x):
            return super().forward(x) * 2

    assert not fused_head(Adapted(4, 8))
    assert not fused_head(torch.nn.Embedding(8, 4))
    hooked = torch.nn.Linear(4, 8)
    hooked.register_forward_hook(lambda module, args, out: out * 2)
    assert not fused_head(hooked)
