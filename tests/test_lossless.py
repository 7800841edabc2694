"""Lossless mode is exactly transformers' greedy AR decoding, while verifying parallel drafts."""

import pytest
import torch
from tiny_models import MASK_ID, random_prompts, tiny_model

import wedlm_hf


@pytest.mark.parametrize("family", ["wedlm", "wedlm-qwen2", "llama", "qwen3"])
@pytest.mark.parametrize("window_size,threshold", [(1, 0.4), (3, 0.4), (8, 100.0), (16, 2.0)])
@pytest.mark.parametrize("lengths", [[6], [5, 11, 2]])
def test_lossless_equals_greedy(family, window_size, threshold, lengths):
    model = wedlm_hf.enable(tiny_model(family, seed=window_size + len(lengths), peak=40))
    input_ids, attention_mask = random_prompts(lengths, seed=window_size)
    greedy = model.generate(input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=28, do_sample=False)
    output = model.generate(
        input_ids=input_ids,
        attention_mask=attention_mask,
        max_new_tokens=28,
        decoding="wedlm",
        wedlm_lossless=True,
        mask_token_id=MASK_ID,
        wedlm_window_size=window_size,
        wedlm_entropy_threshold=threshold,
        return_dict_in_generate=True,
    )
    assert torch.equal(output.sequences, greedy)
    stats = output.wedlm_stats
    assert all(g >= f for g, f in zip(stats.generated, stats.forwards)), "every forward commits at least one token"
    assert all(a <= d for a, d in zip(stats.accepted, stats.drafted))


def test_lossless_accepts_drafts_when_drafts_are_right():
    """A model whose AR and mask predictions agree (a constant continuation) gets many tokens per forward."""
    model = tiny_model("wedlm", peak=40)
    with torch.no_grad():  # all logits 0: every position predicts token 0, AR and mask alike
        model.lm_head.weight.zero_()
    input_ids, attention_mask = random_prompts([4, 8])
    output = model.generate(
        input_ids=input_ids,
        attention_mask=attention_mask,
        max_new_tokens=32,
        decoding="wedlm",
        wedlm_lossless=True,
        wedlm_entropy_threshold=100.0,  # bold drafts: fill every mask
        return_dict_in_generate=True,
    )
    greedy = model.generate(input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=32, decoding="ar")
    assert torch.equal(output.sequences, greedy)
    assert min(output.wedlm_stats.tokens_per_forward) > 4
    assert output.wedlm_stats.summary()["accepted"] > 0


def test_lossless_rejects_sampling_and_processors():
    model = tiny_model("wedlm", peak=40)
    input_ids, attention_mask = random_prompts([4])
    common = dict(input_ids=input_ids, attention_mask=attention_mask, decoding="wedlm", wedlm_lossless=True)
    with pytest.raises(ValueError, match="do_sample"):
        model.generate(**common, do_sample=True)
    with pytest.raises(ValueError, match="RepetitionPenalty"):
        model.generate(**common, repetition_penalty=1.3)
