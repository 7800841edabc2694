"""Host syncs per decoding step: at most 2 (the loop's own exit/shape check), plain and lossless, greedy and
sampled, with temperature/top-k/top-p/min-p and repetition penalties (applied densely per row: sampling.py).

`wedlm_hf.bench.syncs.SyncCounter` counts every host read of a device value (patched `Tensor` methods). Counting covers the whole decoding loop, model forwards included, with no streamer and no user
stopping criterion (each of those legitimately reads tokens on the host).
"""

import pytest
import torch
from tiny_models import MASK_ID, random_prompts, tiny_model

import wedlm_hf
from wedlm_hf.bench.syncs import SyncCounter
from wedlm_hf.generation import fill, loop

SYNCS_PER_STEP = 2


def syncs_per_step(
    monkeypatch, family: str, lengths: list[int], repeat: int = 0, **options
) -> tuple[float, list[str]]:
    """Host reads per step over `lengths` random prompts, each followed by its first `repeat` tokens again."""
    monkeypatch.setattr(fill, "HOST_READS_ARE_FREE", ())  # count what an accelerator runs: a read stalls it
    model = wedlm_hf.enable(tiny_model(family, seed=2, peak=40))
    input_ids, attention_mask = random_prompts(lengths, seed=4)
    if repeat:
        first = (attention_mask == 0).sum(1, keepdim=True) + torch.arange(repeat)
        input_ids = torch.cat([input_ids, input_ids.gather(1, first)], 1)
        attention_mask = torch.cat([attention_mask, torch.ones_like(first)], 1)
    counter = SyncCounter()
    with counter.patched(monkeypatch):
        output = model.generate(
            input_ids=input_ids,
            attention_mask=attention_mask,
            decoding="wedlm",
            mask_token_id=MASK_ID,
            max_new_tokens=40,
            return_dict_in_generate=True,
            **options,
        )
    steps = output.wedlm_stats.model_calls
    assert steps > 3
    return counter.count / steps, counter.where


@pytest.mark.parametrize("family", ["wedlm", "llama"])
@pytest.mark.parametrize(
    "options",
    [
        {},
        {"wedlm_entropy_threshold": None},
        {"wedlm_entropy_threshold": 2.0, "wedlm_window_size": 6},
        {"wedlm_blockwise": True},
        {"wedlm_lossless": True},
        {"wedlm_lossless": True, "wedlm_entropy_threshold": 2.0},
        *(
            {**mode, **sampling}
            for mode in ({}, {"wedlm_lossless": True})
            for sampling in (
                {"do_sample": True, "temperature": 0.7, "top_k": 20, "top_p": 0.9, "min_p": 0.05},
                {"repetition_penalty": 1.3},
                {"do_sample": True, "temperature": 1.2, "repetition_penalty": 1.2},
            )
        ),
    ],
)
@pytest.mark.parametrize("lengths", [[7], [5, 9, 3]])
def test_at_most_two_host_syncs_per_step(monkeypatch, family, options, lengths):
    per_step, where = syncs_per_step(monkeypatch, family, lengths, **options)
    assert 1 <= per_step <= SYNCS_PER_STEP, f"{per_step:.2f} syncs per step: {sorted(set(where))}"


@pytest.mark.parametrize("options", [{}, {"do_sample": True, "temperature": 0.7, "top_k": 20}])
def test_prompt_lookup_in_the_prefill_adds_no_sync(monkeypatch, options):
    """Prompts that repeat their start, so the first forward checks drafts from the prompt too."""
    options = {"wedlm_lossless": True, "wedlm_prompt_lookup": True, **options}
    per_step, where = syncs_per_step(monkeypatch, "wedlm", [7, 4, 9], repeat=3, **options)
    assert 1 <= per_step <= SYNCS_PER_STEP, f"{per_step:.2f} syncs per step: {sorted(set(where))}"


def test_counter_sees_a_sync(monkeypatch):
    """The counter is live: a decoding loop that reads a value on the host each step is caught."""
    original_feed = loop.feed

    def syncing_feed(state, *args, **kwargs):
        for _ in range(3):
            state.length.max().item()
            bool(state.length.any())
        return original_feed(state, *args, **kwargs)

    monkeypatch.setattr(loop, "feed", syncing_feed)
    per_step, where = syncs_per_step(monkeypatch, "wedlm", [6])
    assert per_step >= 6 and "item" in where and "__bool__" in where
