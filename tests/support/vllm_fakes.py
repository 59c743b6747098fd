"""A fake `vllm.LLM` for the main suite (vLLM itself lives in its own environment,
see .ci/vllm.sh): it records calls and refuses what vLLM 0.32 refuses.

- A function sent to the model (`apply_model`, `collective_rpc`) is refused unless the
  engine core runs in this process (`external_launcher`): vLLM's multiprocess executor
  serialises with msgpack and refuses any function unless
  VLLM_ALLOW_INSECURE_SERIALIZATION=1 (it does not pickle them).
- `load_weights` after the first load is refused outside a layerwise-reload session,
  as vLLM's CPU layers (weights prepacked after loading) refuse it.
- `sleep` where the engine was built without sleep mode is refused, as vLLM's
  platforms without sleep mode refuse `enable_sleep_mode=True` at build.
- Streaming (`llm_engine`: add_request / step / abort_request): every live request
  samples one token a step; the token at a sequence's position p is 5 + p % 5, and p
  with p % 11 == 10 is the eos; a token's log-prob is -0.1 × (1 + weight loads so
  far), so the weights that sampled it show. `reset_prefix_cache` and `generate`
  with requests live are refused: vLLM resets no prefix cache while requests run, and
  `LLM.generate` would step (and swallow) them.
"""
from types import SimpleNamespace

__all__ = ["FakeLLM", "FakeParams", "fake_output", "FAKE_RELOAD", "FakeLLMEngine"]


class FakeLLMEngine:
    def __init__(self, llm, dtype):
        self.llm, self.model_config = llm, SimpleNamespace(dtype=dtype)
        self.live: dict[str, dict] = {}
        self.added: list[tuple[str, list[int], dict]] = []  # (id, prompt ids, params)

    def add_request(self, request_id, prompt, params):
        assert request_id not in self.live, f"duplicate request id {request_id}"
        ids = list(prompt["prompt_token_ids"])
        self.added.append((request_id, ids, params.kwargs))
        self.live[request_id] = {"seq": ids, "left": params.kwargs["max_tokens"],
                                 "eos": params.kwargs["stop_token_ids"][0]}
        return request_id

    def abort_request(self, request_ids, internal=False):
        for rid in request_ids:
            self.live.pop(rid, None)
        self.llm.calls.append(("abort", len(request_ids)))

    def has_unfinished_requests(self):
        return bool(self.live)

    def step(self):
        outputs = []
        logp = -0.1 * (1 + self.llm.loads)
        for rid, req in list(self.live.items()):
            p = len(req["seq"])
            tok = req["eos"] if p % 11 == 10 else 5 + p % 5
            req["seq"].append(tok)
            req["left"] -= 1
            finished = tok == req["eos"] or req["left"] <= 0
            if finished:
                del self.live[rid]
            outputs.append(SimpleNamespace(request_id=rid, finished=finished,
                                           outputs=[SimpleNamespace(
                                               token_ids=[tok],
                                               logprobs=[{tok: SimpleNamespace(logprob=logp)}])]))
        return outputs


class FakeLLM:
    def __init__(self, **kwargs):
        self.kwargs, self.calls, self.loaded = kwargs, [], {}
        self.in_process = kwargs.get("distributed_executor_backend") == "external_launcher"
        self.reloading, self.loads = False, 0
        self.llm_engine = FakeLLMEngine(self, kwargs.get("dtype"))

    def _send(self, fn):
        if not self.in_process and callable(fn):
            raise TypeError(f"vLLM's multiprocess executor cannot serialise {fn!r}: msgpack "
                            "refuses functions unless VLLM_ALLOW_INSECURE_SERIALIZATION=1")

    def apply_model(self, fn):
        self._send(fn)
        return [fn(SimpleNamespace(load_weights=self._load, fake=self))]

    def collective_rpc(self, method, args=()):
        self._send(method)
        return [method(SimpleNamespace(), *args)]

    def _load(self, weights):
        if self.loads and not self.reloading:
            raise AttributeError("'Parameter' object has no attribute 'weight_loader' (a "
                                 "processed layer takes new weights only in a layerwise "
                                 "reload session)")
        names = []
        for name, tensor in weights:
            self.loaded[name] = tensor.clone()
            names.append(name)
        self.loads += 1
        self.calls.append(("load", len(names)))

    def reset_prefix_cache(self):
        assert not self.llm_engine.live, "vLLM resets no prefix cache while requests run"
        self.calls.append(("reset_prefix_cache",))

    def sleep(self, level):
        if not self.kwargs.get("enable_sleep_mode"):
            raise ValueError("Sleep mode is not enabled (enable_sleep_mode=False at build)")
        self.calls.append(("sleep", level))

    def wake_up(self, tags=None):
        self.calls.append(("wake_up", tuple(tags or ())))

    def generate(self, prompts, params, use_tqdm=False):
        assert not self.llm_engine.live, "LLM.generate would step the stream's requests"
        self.calls.append(("generate", len(prompts)))
        eos = params.kwargs["stop_token_ids"][0]
        return [fake_output([5, 6, eos], [-0.5, -0.25, -1.0]) for _ in prompts]


def _begin(model):
    model.fake.reloading = True
    model.fake.calls.append(("begin_reload",))


def _finish(model, model_config):
    assert model_config is model.fake.llm_engine.model_config
    model.fake.reloading = False
    model.fake.calls.append(("finish_reload",))


FAKE_RELOAD = (_begin, _finish)  # vLLM's initialize/finalize_layerwise_reload


class FakeParams:
    def __init__(self, **kwargs):
        self.kwargs = kwargs


def fake_output(ids, logps):
    ranked = [{t: SimpleNamespace(logprob=lp)} for t, lp in zip(ids, logps)]
    return SimpleNamespace(outputs=[SimpleNamespace(token_ids=ids, logprobs=ranked)])
