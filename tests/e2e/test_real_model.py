"""The real pretrained model (SmolLM2-135M-Instruct, made by `hybridflow model smollm2`
into $HYBRIDFLOW_SMOLLM2_DIR: .ci/model.sh), end to end with the HF engine: its saved
special ids, and a GRPO step (and a validation) on word_arith whose loss mask covers
the response tokens only, with sample generations written. Skipped when the variable is unset."""
import json
import os

import pytest

MODEL = os.environ.get("HYBRIDFLOW_SMOLLM2_DIR")
needs_model = pytest.mark.skipif(
    not (MODEL and os.path.isfile(os.path.join(MODEL, "config.json"))),
    reason="HYBRIDFLOW_SMOLLM2_DIR is unset or holds no model (.ci/model.sh makes it)")


@needs_model
def test_the_converted_model_has_agreeing_special_ids_and_a_chat_template():
    from transformers import AutoConfig, AutoTokenizer
    tok, config = AutoTokenizer.from_pretrained(MODEL), AutoConfig.from_pretrained(MODEL)
    with open(os.path.join(MODEL, "generation_config.json")) as fh:
        generation = json.load(fh)
    assert tok.eos_token == "<|im_end|>" and tok.chat_template
    for key in ("eos_token_id", "bos_token_id"):
        assert getattr(config, key) == getattr(tok, key) == generation[key], key
    assert (config.model_type, config.num_hidden_layers, config.tie_word_embeddings) == \
        ("llama", 30, True)


@pytest.mark.slow
@needs_model
def test_a_grpo_step_trains_response_tokens_only_and_writes_generations(tmp_path):
    from hybridflow.core.data import word_arith_rows, write_rows
    from hybridflow.run.generations import train_nodes
    from hybridflow.workers.tokenizer import load_tokenizer
    from tests.support.e2e import train
    rows_train, rows_test = word_arith_rows(1, 8, 2, 20)
    write_rows(rows_train, str(tmp_path / "train.jsonl"))
    write_rows(rows_test, str(tmp_path / "test.jsonl"))
    trainer, metrics = train(
        "grpo", tmp_path, f"model.path={MODEL}", "model.tokenizer=auto",
        f"data.train_files={tmp_path / 'train.jsonl'}",
        f"data.val_files={tmp_path / 'test.jsonl'}", "data.max_prompt_length=96",
        "data.batch_size=2", "rollout.n=2", "rollout.max_new_tokens=12",
        "rollout.micro_batch_size=4", "rollout.log_prob_micro_batch_size=4",
        "actor.mini_batch_size=4", "actor.micro_batch_size=4", "actor.lr=1e-6",
        "actor.use_kl_loss=false", "reward.kwargs.method=flexible", "trainer.steps=1",
        "trainer.val_every=1", "trainer.val_samples=1", "trainer.log_generations=2",
        "runtime.torch_threads=2")
    assert json.load(open(trainer.run.file("status.json")))["state"] == "finished"
    assert metrics[-1]["step"] == 1 and "actor/pg_loss" in metrics[-1]
    # the last step's rollout: what actor.update trained on
    rollout, _ = train_nodes(trainer.plan)
    out = trainer.last_result.outputs[rollout]
    tok = load_tokenizer(MODEL)
    mask, responses, prompts = out["response_mask"], out["responses"], out["prompts"]
    header = tok("<|im_start|>assistant\n", add_special_tokens=False)["input_ids"]
    for i in range(len(mask)):
        kept = responses[i][mask[i].bool()].tolist()
        assert kept, "an empty response"
        assert mask[i][: len(kept)].all() and not mask[i][len(kept):].any()  # one span
        # the template's assistant header is the prompt's end, never a trained token
        assert prompts[i][-len(header):].tolist() == header
        assert tok.convert_tokens_to_ids("<|im_start|>") not in kept
        # eos (== pad here) only as the span's last token: padding is never trained
        assert tok.eos_token_id not in kept[:-1]
    with open(trainer.run.file("generations.jsonl")) as fh:
        samples = [json.loads(line) for line in fh]
    assert {s["split"] for s in samples} == {"train", "val"}
    assert all(s["data_source"] == "word_arith" and s["prompt"].startswith("<|im_start|>")
               for s in samples)
