"""`hybridflow check`, `render` and `plan` on the shipped graphs load only what they use:
not Ray, vLLM or transformers (a second of import: `check` on graphs/sft.py cost 2.2x
`import torch` while its build made the tokenizer). How fast is bench/check.py's
question; which modules are loaded is this file's. The SFT graphs' example makers load
their tokenizer on first use (tests/algorithms/test_envs.py runs the agent one's)."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import torch

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HEAVY = ("ray", "vllm", "transformers", "tokenizers")


def _run_light(commands: list[list[str]]) -> str:
    """Runs each hybridflow command in one fresh interpreter; fails naming the heavy
    modules loaded after any of them."""
    script = textwrap.dedent(f"""
        import sys
        from hybridflow.cli import main
        for argv in {commands!r}:
            code = main(argv)
            heavy = sorted({{m.split(".")[0] for m in sys.modules}} & set({HEAVY!r}))
            assert code == 0, (argv, code)
            assert not heavy, (argv, heavy)
        print("light")
    """)
    proc = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def test_check_of_every_shipped_graph_loads_no_model_library():
    graphs = sorted(name for name in os.listdir(os.path.join(REPO, "graphs"))
                    if name.endswith(".py") and name not in ("__init__.py", "common.py",
                                                             "common_agent.py", "ops.py"))
    assert {"sft.py", "agent_sft.py", "ppo.py", "grpo.py"} <= set(graphs)
    out = _run_light([["check", os.path.join("graphs", name)] for name in graphs])
    assert out.count("\nok\n") + out.startswith("ok\n") == len(graphs), out[-2000:]


def test_render_and_plan_load_no_model_library(tmp_path):
    dot = str(tmp_path / "sft.dot")
    out = _run_light([["render", "graphs/sft.py", "-o", dot],
                      ["render", "graphs/ppo.py", "--plan", "-o", str(tmp_path / "ppo.dot")],
                      ["plan", "graphs/ppo.py", "--gpus-per-node", "8"]])
    assert "Best plan" in out
    with open(dot, encoding="utf-8") as handle:
        assert "actor.sft" in handle.read()


def test_sft_examples_load_the_tokenizer_when_first_called():
    from graphs.sft import SFTExamples
    from hybridflow import Batch, load_tokenizer
    make = SFTExamples("char", stop_fraction=1.0, seed=0)
    rows = make(Batch(non_tensors={"raw_prompt": ["1+2=", "3+4="], "ground_truth": ["3", "7"]}))
    tok = load_tokenizer("char")
    first = tok("1+2=", add_special_tokens=False)["input_ids"] \
        + tok("3", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    assert rows["input_ids"][0, :len(first)].tolist() == first
    assert rows["loss_mask"][0].tolist()[:len(first)] == [0] * 4 + [1, 1]
    assert torch.equal(rows["attention_mask"].sum(-1), torch.tensor([6, 6]))

