"""The embedded SmolLM2 adapter `smollm2-wedlm` (docs/finetune.md), a draft-only adapter: it loads by name, decodes
with lossless WeDLM by default, returns exactly what SmolLM2 itself answers, and drafts that pass on the text it was
adapted for."""

import json

import pytest
import torch

import wedlm_hf
from real_model import gguf_path
from wedlm_hf.cli import main as wedlm_hf_cli
from wedlm_hf.loading import load_model_and_tokenizer

COUNTING = "1, 2, 3, 4, 5, 6, 7, 8, "


@pytest.fixture(scope="module")
def adapted():
    gguf_path()  # skips without the `real` extra
    pytest.importorskip("peft", reason="the adapter loads with PEFT: pip install -e '.[finetune]'")
    model, tokenizer = load_model_and_tokenizer("smollm2-wedlm")
    return wedlm_hf.enable(model), tokenizer


def test_loads_by_name_with_lossless_wedlm_as_its_default(adapted):
    """Lossless is its default: plain decoding's mask predictions are good on counting-like text only."""
    model, tokenizer = adapted
    config = model.generation_config
    assert config.decoding == "wedlm" and config.wedlm_lossless is True
    assert config.mask_token_id == 16 and 16 in config.suppress_tokens
    assert tokenizer.convert_ids_to_tokens(config.mask_token_id) == "<empty_output>"
    inputs = tokenizer("def fibonacci(n):\n", return_tensors="pt")
    with torch.inference_mode():
        greedy = model.generate(**inputs, decoding="ar", max_new_tokens=24)
        default = model.generate(**inputs, max_new_tokens=24)
    assert torch.equal(default, greedy)


@pytest.fixture(scope="module")
def smollm2():
    """SmolLM2 loaded on its own, without the adapter."""
    return load_model_and_tokenizer("smollm2")[0]


def test_its_answers_are_smollm2s_own(adapted, smollm2):
    """Against the base model loaded on its own: chat answers and code, by the adapter's default decoding."""
    model, tokenizer = adapted
    base = smollm2
    chats = ["What is the capital of France?", "Name three primary colors."]
    texts = [tokenizer.apply_chat_template([{"role": "user", "content": c}], tokenize=False, add_generation_prompt=True) for c in chats]
    for text in [*texts, "def fibonacci(n):\n"]:
        inputs = tokenizer(text, return_tensors="pt", add_special_tokens=False)
        with torch.inference_mode():
            ours = model.generate(**inputs, max_new_tokens=32)
            theirs = base.generate(**inputs, max_new_tokens=32, do_sample=False)
        assert torch.equal(ours, theirs)


def test_a_prompt_holding_its_mask_token_is_answered_as_smollm2_answers_it(adapted, smollm2):
    """`<empty_output>` is the adapter's mask token and any user can type it: in a prompt it is an observed token,
    so the adapter leaves it alone and the answer is SmolLM2's own."""
    model, tokenizer = adapted
    inputs = tokenizer("Fill in the blank: The capital of France is <empty_output>.", return_tensors="pt")
    assert (inputs["input_ids"] == model.generation_config.mask_token_id).sum() == 1
    with torch.inference_mode():
        # its default: lossless; every slot drafted (the adaptive schedule checks no unconfident first window)
        ours = model.generate(**inputs, max_new_tokens=24, wedlm_draft_schedule="full", return_dict_in_generate=True)
        theirs = smollm2.generate(**inputs, max_new_tokens=24, do_sample=False)
    assert torch.equal(ours.sequences, theirs)
    assert ours.wedlm_stats.summary()["drafted"] > 0


def test_lossless_is_greedy_and_accepts_drafts_on_counting(adapted):
    model, tokenizer = adapted
    inputs = tokenizer(COUNTING, return_tensors="pt")
    with torch.inference_mode():
        greedy = model.generate(**inputs, decoding="ar", max_new_tokens=48)
        out = model.generate(**inputs, wedlm_lossless=True, max_new_tokens=48, return_dict_in_generate=True)
    assert torch.equal(out.sequences, greedy)
    summary = out.wedlm_stats.summary()
    assert summary["accepted"] > 0 and summary["tokens_per_forward_row_mean"] > 1.5  # the base model: 1.00


def test_cli_generates_with_the_named_model(capsys):
    gguf_path()
    pytest.importorskip("peft")
    assert wedlm_hf_cli(["generate", "--model", "smollm2-wedlm", "--lossless", "--max-new-tokens", "16", COUNTING]) == 0
    assert "[wedlm]" in capsys.readouterr().out


def test_finetune_cli_adapts_smollm2_in_a_few_steps(tmp_path, capsys):
    """The recipe that made the adapter, on the real model for a few steps: the masked-prediction loss falls from
    the base model's (which has never seen its mask token), and the adapter decodes with WeDLM by default."""
    gguf_path()
    pytest.importorskip("peft")
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps({"text": ", ".join(str(j) for j in range(i, i + 40))}) + "\n" for i in range(40)))
    output = tmp_path / "adapter"
    arguments = [
        "finetune", "smollm2", "--data", str(data), "--output-dir", str(output), "--lora-r", "4", "--seq-len", "48",
        "--block-size", "16", "--batch-size", "2", "--max-steps", "6", "--warmup-steps", "0", "--eval-steps", "6",
        "--save-steps", "6", "--learning-rate", "3e-3", "--no-evaluate",
    ]
    assert wedlm_hf_cli(arguments) == 0
    capsys.readouterr()
    summary = json.loads((output / "finetune_summary.json").read_text())
    assert summary["written"] == "draft-only adapter" and summary["steps"] == 6 and summary["mask_token_id"] == 16
    assert summary["eval"]["eval_mdm"] < 0.5 * summary["eval_before"]["eval_mdm"]
    model, tokenizer = load_model_and_tokenizer(str(output))
    inputs = tokenizer(COUNTING, return_tensors="pt")
    with torch.inference_mode():
        out = wedlm_hf.enable(model).generate(**inputs, max_new_tokens=8, return_dict_in_generate=True)
    assert model.generation_config.decoding == "wedlm" and out.wedlm_stats.summary()["generated"] == 8
