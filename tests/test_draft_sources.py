"""A new draft source is one object with the `DraftSource` methods (`generation/draft_source.py`) handed to
`LosslessPolicy`: its drafts are verified like the built-in ones, so the output stays transformers' greedy
`generate()` whether they are right (fewer forwards) or always wrong (the same forwards, every draft rejected)."""

import pytest
import torch
from tiny_models import MASK_ID, random_prompts, tiny_model

import wedlm_hf
from wedlm_hf.generation import decoding
from wedlm_hf.generation.draft_source import AfterCommit
from wedlm_hf.generation.lossless import LosslessPolicy
from wedlm_hf.generation.record import OutputRecord
from wedlm_hf.generation.window import Updates, WindowLayout, WindowState

NEW_TOKENS = 24


class Reference:
    """Drafts the next `tokens` tokens of a known output (shifted by `offset`: 0 right, 1 always wrong) into the
    slots after the certain token, in rows whose window holds no draft there."""

    first_slots = 0

    def __init__(self, layout: WindowLayout, record: OutputRecord, reference: torch.Tensor, offset: int):
        self.layout, self.record, self.reference, self.offset, self.tokens = layout, record, reference, offset, 4
        self.in_chain = torch.zeros(record.sequences.shape[0], dtype=torch.bool)

    def first(self, state: WindowState) -> None:
        return None

    def draft(self, state: WindowState, after: AfterCommit) -> None:
        room = torch.clamp(state.max_new_tokens - state.generated, max=self.layout.window_size)
        count = (room - 2).clamp(0, self.tokens).masked_fill(state.window[:, 1] != MASK_ID, 0)
        steps = torch.arange(self.tokens)
        columns = (self.record.prompt_length + state.generated)[:, None] + 1 + steps
        tokens = self.reference[state.rows[:, None], columns.clamp(max=self.reference.shape[1] - 1)]
        tokens = (tokens + self.offset) % MASK_ID
        placed = steps < count[:, None]
        drafts = state.window[:, 1 : 1 + self.tokens]
        drafts.copy_(torch.where(placed, tokens, drafts))
        state.fill_step[:, 1 : 1 + self.tokens].masked_fill_(placed, self.record.steps)
        state.length = torch.where(count > 0, torch.maximum(state.length, count + 2), state.length)
        self.in_chain = count > 0

    def select(self, index: torch.Tensor) -> None:
        self.in_chain = self.in_chain[index]

    def joined(self, other: "Reference") -> Updates:
        return [(self, {"in_chain": torch.cat([self.in_chain, other.in_chain])})]


@pytest.mark.parametrize("schedule", ["adaptive", "full"])
def test_a_new_draft_source_is_verified_like_the_others(monkeypatch, schedule):
    model = wedlm_hf.enable(tiny_model("llama", seed=1, peak=40))
    input_ids, attention_mask = random_prompts([9, 5, 12], seed=2)
    greedy = model.generate(
        input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=NEW_TOKENS, do_sample=False
    )

    def lossless(offset: int | None):
        class WithReference(LosslessPolicy):
            def __init__(self, layout, record, *args, **kwargs):
                extra = () if offset is None else (Reference(layout, record, greedy, offset),)
                super().__init__(layout, record, *args, sources=extra, **kwargs)

        monkeypatch.setattr(decoding, "LosslessPolicy", WithReference)
        return model.generate(
            input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=NEW_TOKENS, decoding="wedlm",
            wedlm_lossless=True, mask_token_id=MASK_ID, return_dict_in_generate=True, wedlm_draft_schedule=schedule,
        )

    alone, right, wrong = lossless(None), lossless(0), lossless(1)
    for output in (alone, right, wrong):
        assert torch.equal(output.sequences, greedy)
    per_forward = {
        name: output.wedlm_stats.summary()["tokens_per_forward_row_mean"]
        for name, output in (("alone", alone), ("right", right), ("wrong", wrong))
    }
    assert per_forward["right"] > per_forward["alone"] >= per_forward["wrong"], per_forward
