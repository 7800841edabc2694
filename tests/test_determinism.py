"""Greedy output is a function of the input alone: across runs, batch compositions and deterministic mode."""

import torch
from tiny_models import MASK_ID, random_prompts, tiny_model

import wedlm_hf


def decode(model, input_ids, attention_mask, **kwargs):
    return model.generate(
        input_ids=input_ids, attention_mask=attention_mask, decoding="wedlm", max_new_tokens=20, **kwargs
    )


def test_greedy_is_identical_across_batch_compositions():
    model = tiny_model("qwen2", seed=5, peak=40)
    wedlm_hf.enable(model)
    input_ids, attention_mask = random_prompts([6, 3, 9, 4], seed=4)
    width = input_ids.shape[1]
    options = dict(mask_token_id=MASK_ID, return_dict_in_generate=True)
    full = decode(model, input_ids, attention_mask, **options)
    reordered = decode(model, input_ids[[2, 0, 3, 1]], attention_mask[[2, 0, 3, 1]], **options)
    pair = decode(model, input_ids[[1, 2]], attention_mask[[1, 2]], **options)
    assert torch.equal(full.sequences[[2, 0, 3, 1]], reordered.sequences)
    for got, row in zip(pair.sequences, [1, 2]):
        length = full.wedlm_stats.generated[row]
        assert torch.equal(got[width : width + length], full.sequences[row, width : width + length])


def test_deterministic_algorithms_mode_gives_the_same_tokens():
    """Documented: on CPU every op the decoder uses has a deterministic kernel; output is unchanged."""
    model = tiny_model("wedlm", seed=6, peak=40)
    input_ids, attention_mask = random_prompts([5, 8], seed=6)
    normal = decode(model, input_ids, attention_mask)
    torch.use_deterministic_algorithms(True)
    try:
        strict = decode(model, input_ids, attention_mask)
        torch.manual_seed(3)
        sampled = decode(model, input_ids, attention_mask, do_sample=True, top_p=0.8)
        torch.manual_seed(3)
        sampled_again = decode(model, input_ids, attention_mask, do_sample=True, top_p=0.8)
    finally:
        torch.use_deterministic_algorithms(False)
    assert torch.equal(normal, strict)
    assert torch.equal(sampled, sampled_again)
