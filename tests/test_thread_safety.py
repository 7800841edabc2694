"""One model, two threads (the demo's WeDLM and AR sides): each `generate` equals its lone result, and no forward
sees another attention implementation than the model's own, because window forwards ask for the window attention
per call instead of switching the model's."""

import threading

import torch
from tiny_models import MASK_ID, random_prompts, tiny_model
from patience import PATIENCE_S

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
    seen, outputs, errors = [], {name: [] for name in runs}, []
    hook = model.register_forward_pre_hook(lambda module, args: seen.append(module.config._attn_implementation))
    start = threading.Barrier(len(runs))

    def side(name: str) -> None:
        try:
            start.wait()
            for _ in range(ROUNDS):
                outputs[name].append(generate(runs[name]))
        except Exception as error:  # reported below, on the test's thread
            errors.append(error)

    threads = [threading.Thread(target=side, args=(name,)) for name in runs]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=PATIENCE_S)
    hook.remove()
    assert not errors, errors
    for name in runs:
        assert len(outputs[name]) == ROUNDS and all(torch.equal(out, lone[name]) for out in outputs[name]), name
    assert set(seen) == {"sdpa"}  # no forward ever ran under a switched implementation
