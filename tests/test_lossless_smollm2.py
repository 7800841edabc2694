"""Lossless mode with logits processors and prompt lookup on a real pretrained LM (SmolLM2-135M-Instruct, fp32,
see tests/real_model.py): output equals transformers' greedy `generate()` with the same options, batched with
left padding."""

import pytest
import torch

import wedlm_hf
from real_model import load_smollm2

MASK_ID = 16
"""`<empty_output>`, never in these prompts (see tests/test_real_model.py)."""
PROMPTS = ["The capital of France is", "def fibonacci(n):", "1, 2, 3, 4, 5,"]
QUOTED = (
    "def area(width, height):\n    if width < 0 or height < 0:\n        raise ValueError('negative size')\n"
    "    return width * height\n"
)


@pytest.fixture(scope="module")
def smollm2():
    model, tokenizer = load_smollm2(torch.float32)
    tokenizer.padding_side = "left"
    return wedlm_hf.enable(model), tokenizer


@pytest.mark.parametrize("case", ["penalties-and-length", "bad-words-and-decay"])
def test_lossless_with_processors_equals_greedy_on_smollm2(smollm2, case):
    model, tokenizer = smollm2
    inputs = tokenizer(PROMPTS, return_tensors="pt", padding=True)
    common = dict(**inputs, max_new_tokens=24, do_sample=False)
    plain = model.generate(**common)[:, inputs["input_ids"].shape[1] :]
    if case == "penalties-and-length":
        options = dict(repetition_penalty=1.3, no_repeat_ngram_size=3, min_new_tokens=10)
    else:  # bigrams greedy decoding produces, banned or biased away
        options = dict(
            bad_words_ids=[plain[0, 2:4].tolist(), plain[2, 5:7].tolist()],
            sequence_bias={tuple(plain[1, 3:5].tolist()): -6.0},
            exponential_decay_length_penalty=(6, 1.3),
        )
    greedy = model.generate(**common, **options)
    assert not torch.equal(greedy[:, inputs["input_ids"].shape[1] :], plain)
    output = model.generate(**common, **options, decoding="wedlm", wedlm_lossless=True, mask_token_id=MASK_ID)
    assert torch.equal(output, greedy)


def test_prompt_lookup_equals_greedy_and_pays_on_a_quoted_function(smollm2):
    model, tokenizer = smollm2
    chats = [
        [{"role": "user", "content": f"Add a docstring to this function. Reply with the whole function.\n\n{QUOTED}"}],
        [{"role": "user", "content": f"Repeat this function exactly.\n\n{QUOTED}"}],
    ]
    texts = [tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True) for chat in chats]
    inputs = tokenizer(texts, return_tensors="pt", padding=True)
    common = dict(**inputs, max_new_tokens=48, do_sample=False)
    greedy = model.generate(**common)
    lossless = dict(decoding="wedlm", wedlm_lossless=True, mask_token_id=MASK_ID, return_dict_in_generate=True)
    alone = model.generate(**common, **lossless)
    both = model.generate(**common, **lossless, wedlm_prompt_lookup=True)
    assert torch.equal(alone.sequences, greedy) and torch.equal(both.sequences, greedy)
    alone_rate = alone.wedlm_stats.summary()["tokens_per_forward_row_mean"]
    both_rate = both.wedlm_stats.summary()["tokens_per_forward_row_mean"]
    assert both_rate > alone_rate, (both_rate, alone_rate)
