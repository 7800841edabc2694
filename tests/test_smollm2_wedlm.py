"""The embedded SmolLM2 adapter `smollm2-wedlm` (docs/finetune.md): it loads by name, decodes with WeDLM by
default, stays exactly greedy in lossless mode, and drafts that pass on the text it was adapted for."""

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


def test_loads_by_name_with_wedlm_as_its_default(adapted):
    model, tokenizer = adapted
    config = model.generation_config
    assert config.decoding == "wedlm" and config.mask_token_id == 16 and 16 in config.suppress_tokens
    assert tokenizer.convert_ids_to_tokens(config.mask_token_id) == "<empty_output>"


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
