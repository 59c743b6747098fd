"""The vLLM engine's streaming calls (vllm_stream.py) against a fake `LLM.llm_engine`
(tests/support/vllm_fakes.py: each live request samples one token a step, the token
depends on its position only, its log-prob on the weights loaded so far): requests go
to vLLM's engine, a weight update takes them out before the prefix cache is reset and
puts them back continuing (partial) or restarting, and each token keeps the version
and log-prob it was sampled with. tests/workers/test_vllm_real.py runs real vLLM."""
import pytest
import torch

from hybridflow.workers.base import WorkerContext
from hybridflow.workers.config import ModelConfig, RolloutConfig, read_section
from hybridflow.workers.rollout.engine import EngineSpec, StreamingEngine
from hybridflow.workers.rollout.generation import sampling_options
from hybridflow.workers.rollout.stream import NO_TOKEN
from hybridflow.workers.rollout.vllm import make_vllm_engine
from hybridflow.workers.rollout.weights import refresh_engine
from hybridflow.workers.tokenizer import load_tokenizer, tokenizer_spec
from tests.support.vllm_fakes import FAKE_RELOAD, FakeLLM, FakeParams
from tests.support.workers import PROMPTS, make_cfg, prompt_batch

WIDTH = 6


def _engine(**rollout):
    cfg = make_cfg(rollout={"backend": "vllm", "weight_bucket_mb": 0.01, **rollout})
    model_cfg = read_section(cfg, "model", ModelConfig)
    tok = load_tokenizer(tokenizer_spec(model_cfg))
    spec = EngineSpec(model_cfg, read_section(cfg, "rollout", RolloutConfig), tok,
                      WorkerContext(), torch.device("cpu"))
    return make_vllm_engine(spec, FakeLLM, FakeParams, FAKE_RELOAD), spec


def _opts(spec, **kw):
    return sampling_options(spec.rollout_cfg, **{"n": 1, "max_new_tokens": WIDTH,
                                                 "do_sample": False, **kw})


def _drain(engine):
    out = []
    while engine.stream_busy:
        rows = engine.poll(1)
        if rows is not None:
            out.append(rows)
    return out


def _by_uid(batches):
    rows = {}
    for b in batches:
        for i, uid in enumerate(b["uid"]):
            rows[uid] = b.take([i])
    return rows


def _expected_tokens(prompt_len, eos):
    """The fake's tokens for a prompt of `prompt_len` ids: 5 + p % 5, eos at p % 11 == 10."""
    out, p = [], prompt_len
    while len(out) < WIDTH:
        tok = eos if p % 11 == 10 else 5 + p % 5
        out.append(tok)
        p += 1
        if tok == eos:
            break
    return out


def _new_weights(engine, spec, version):
    from hybridflow.workers.models import build_causal_lm
    module = build_causal_lm(spec.model_cfg, spec.tokenizer, "cpu", version)
    refresh_engine(engine, module, version=version, bucket_bytes=1 << 20)


def test_the_engine_streams_and_its_rows_carry_their_versions():
    engine, spec = _engine()
    assert isinstance(engine, StreamingEngine)
    prompts = prompt_batch(spec.tokenizer, PROMPTS)
    assert engine.submit(prompts, _opts(spec)) == len(PROMPTS)
    assert engine.llm.llm_engine.has_unfinished_requests() and engine.stream_busy
    rows = _by_uid(_drain(engine))
    assert sorted(rows) == sorted(prompts["uid"])
    eos = spec.tokenizer.eos_token_id
    for i, uid in enumerate(prompts["uid"]):
        row = rows[uid]
        plen = int(prompts["attention_mask"][i].sum())
        want = _expected_tokens(plen, eos)
        mask = row["response_mask"][0].bool()
        assert row["responses"][0][: len(want)].tolist() == want
        assert row["token_versions"][0][mask].eq(0).all()
        assert row["token_versions"][0][~mask].eq(NO_TOKEN).all()
        assert int(row["policy_version"][0]) == 0
        # one load at build (the seeded initial weights): log-prob -0.2 on every token
        assert torch.allclose(row["rollout_log_probs"][0][mask], torch.tensor(-0.2))
    assert not engine.llm.llm_engine.live


@pytest.mark.parametrize("partial", [True, False])
def test_new_weights_take_requests_out_before_the_prefix_reset(partial):
    engine, spec = _engine(partial=partial)
    prompts = prompt_batch(spec.tokenizer, PROMPTS)
    engine.submit(prompts, _opts(spec))
    engine.poll(2)  # two tokens each, none finished yet (eos comes later or never)
    fake = engine.llm.llm_engine
    fake.added.clear()
    engine.llm.calls.clear()
    _new_weights(engine, spec, version=1)
    names = [c[0] for c in engine.llm.calls]
    assert names.index("abort") < names.index("reset_prefix_cache")
    assert len(fake.added) == len(PROMPTS)  # every request back in vLLM
    for (_, ids, params), i in zip(fake.added, range(len(PROMPTS))):
        plen = int(prompts["attention_mask"][i].sum())
        if partial:  # continues: its tokens are now part of the prompt vLLM prefills
            assert len(ids) == plen + 2 and params["max_tokens"] == WIDTH - 2
        else:
            assert len(ids) == plen and params["max_tokens"] == WIDTH
    rows = _by_uid(_drain(engine))
    eos = spec.tokenizer.eos_token_id
    for i, uid in enumerate(prompts["uid"]):
        row = rows[uid]
        mask = row["response_mask"][0].bool()
        versions = row["token_versions"][0][mask].tolist()
        logps = row["rollout_log_probs"][0][mask]
        plen = int(prompts["attention_mask"][i].sum())
        # the same tokens as an uninterrupted stream: a continuation resumes where it was
        assert row["responses"][0][mask].tolist() == _expected_tokens(plen, eos)
        if partial:
            assert versions[:2] == [0, 0] and set(versions[2:]) == {1}
            # tokens 0-1 sampled before the load (-0.2), the rest after more loads
            assert torch.allclose(logps[:2], torch.tensor(-0.2)) and (logps[2:] < -0.2).all()
            assert int(row["policy_version"][0]) == 0  # its oldest token's version
        else:
            assert set(versions) == {1} and int(row["policy_version"][0]) == 1
    counts = engine.stream_counts()
    if partial:
        assert counts["mixed_rows"] == len(PROMPTS) and counts["restarts"] == 0
    else:
        assert counts["restarts"] == len(PROMPTS)
        assert counts["aborted_tokens"] == 2 * len(PROMPTS) and counts["mixed_rows"] == 0


def test_generate_during_a_stream_puts_its_requests_back_after():
    engine, spec = _engine(partial=False)
    prompts = prompt_batch(spec.tokenizer, PROMPTS)
    engine.submit(prompts, _opts(spec))
    engine.poll(1)
    out = engine.generate(prompt_batch(spec.tokenizer, ["3+4="]), _opts(spec))
    assert len(out) == 1
    rows = _by_uid(_drain(engine))
    assert len(rows) == len(PROMPTS)
    assert engine.stream_counts()["restarts"] == 0  # same weights: nothing dropped
    assert all(r["token_versions"][0][r["response_mask"][0].bool()].eq(0).all()
               for r in rows.values())


def test_abort_drops_every_request_in_vllm_too():
    engine, spec = _engine()
    engine.submit(prompt_batch(spec.tokenizer, PROMPTS), _opts(spec))
    engine.poll(1)
    assert engine.abort() == len(PROMPTS)
    assert not engine.stream_busy and not engine.llm.llm_engine.live
    assert engine.poll(3) is None


def test_sampled_requests_draw_with_seeds_of_their_own():
    engine, spec = _engine(partial=True)
    prompts = prompt_batch(spec.tokenizer, PROMPTS)
    engine.submit(prompts.repeat(2, interleave=True), _opts(spec, do_sample=True))
    first = [p["seed"] for _, _, p in engine.llm.llm_engine.added]
    assert len(set(first)) == len(first)  # the n samples of a prompt draw differently
    engine.poll(2)
    _new_weights(engine, spec, version=1)
    again = [p["seed"] for _, _, p in engine.llm.llm_engine.added[len(first):]]
    assert not set(again) & set(first)  # a continuation does not replay its start's draws
    assert all(p["output_kind"] == "delta" for _, _, p in engine.llm.llm_engine.added)


def test_one_stream_samples_with_one_set_of_options():
    engine, spec = _engine()
    engine.submit(prompt_batch(spec.tokenizer, PROMPTS), _opts(spec))
    with pytest.raises(ValueError, match="one set of options"):
        engine.submit(prompt_batch(spec.tokenizer, PROMPTS), _opts(spec, max_new_tokens=3))
