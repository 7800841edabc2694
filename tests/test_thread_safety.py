"""One model, two threads (the demo's WeDLM and AR sides): each `generate` equals its lone result, and no forward
sees another attention implementation than the model's own, because window forwards ask for the window attention
per call instead of switching the model's."""

import torch
from side_by_side import run_side_by_side
from tiny_models import MASK_ID, random_prompts, tiny_model

import wedlm_hf

ROUNDS = 4


def test_wedlm_and_ar_generate_from_two_threads_equal_their_lone_results():
    model = wedlm_hf.enable(tiny_model("qwen3", seed=3, peak=40))  # grouped-query SDPA: the window attention applies
    assert model.config._attn_implementation == "sdpa"
    input_ids, attention_mask = random_prompts([6, 4], seed=3)
    runs = {
        "wedlm": dict(decoding="wedlm", mask_token_id=MASK_ID, wedlm_window_size=8),
        "ar": dict(decoding="ar"),
    }

    def generate(options: dict) -> torch.Tensor:
        return model.generate(input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=16, **options)

    lone = {name: generate(options) for name, options in runs.items()}
    seen = []
    hook = model.register_forward_pre_hook(lambda module, args: seen.append(module.config._attn_implementation))
    try:
        outputs = run_side_by_side(runs, generate, ROUNDS)
    finally:
        hook.remove()
    for name in runs:
        assert len(outputs[name]) == ROUNDS and all(torch.equal(out, lone[name]) for out in outputs[name]), name
    assert set(seen) == {"sdpa"}  # no forward ever ran under a switched implementation
