"""Why each row ended (`WeDLMStats.finish_reasons`) is recorded where the row ends, `OutputRecord.commit`, and is
what the row's own tokens show: its EOS, a stopping criterion's token, or its full budget."""

import pytest
import torch
from tiny_models import EOS_ID, MASK_ID, random_prompts, tiny_model
from transformers import StoppingCriteria, StoppingCriteriaList

import wedlm_hf
from wedlm_hf.generation.outputs import EOS, LENGTH, STOP

BUDGET = 24


class EndsOn(StoppingCriteria):
    """Stops a row once its last token is `token` (a stand-in for a stop string, without a tokenizer)."""

    def __init__(self, token: int):
        self.token = token

    def __call__(self, input_ids: torch.LongTensor, scores, **kwargs) -> torch.BoolTensor:
        return input_ids[:, -1] == self.token


@pytest.fixture(scope="module")
def setup():
    """A tiny model whose two most frequent greedy tokens are made an EOS and a stopping criterion's token, so
    that some rows end on each and others use their whole budget."""
    model = wedlm_hf.enable(tiny_model("wedlm"))
    input_ids, attention_mask = prompts = random_prompts([5, 3, 7, 4, 6, 2, 5, 3], seed=1)
    model.generation_config.eos_token_id = None
    free = model.generate(input_ids=input_ids, attention_mask=attention_mask, decoding="ar", max_new_tokens=BUDGET)
    free = free[:, input_ids.shape[1] :]
    counts = torch.bincount(free.flatten(), minlength=MASK_ID + 1)
    eos, stop = counts.argsort(descending=True)[:2].tolist()
    model.generation_config.eos_token_id = [EOS_ID, eos]
    return model, prompts, {EOS_ID, eos}, stop


def expected_reason(tokens: list[int], eos_ids: set[int], stop: int) -> str:
    if tokens[-1] in eos_ids:
        return EOS
    return STOP if tokens[-1] == stop else LENGTH


@pytest.mark.parametrize("options", [{}, {"wedlm_lossless": True}, {"wedlm_window_size": 8}], ids=str)
def test_finish_reasons_are_what_the_tokens_show(setup, options):
    model, (input_ids, attention_mask), eos_ids, stop = setup
    output = model.generate(
        input_ids=input_ids, attention_mask=attention_mask, decoding="wedlm", max_new_tokens=BUDGET,
        mask_token_id=MASK_ID, stopping_criteria=StoppingCriteriaList([EndsOn(stop)]), return_dict_in_generate=True,
        **options,
    )
    stats = output.wedlm_stats
    new = output.sequences[:, input_ids.shape[1] :]
    expected = [expected_reason(new[i, :n].tolist(), eos_ids, stop) for i, n in enumerate(stats.generated)]
    assert stats.finish_reasons == expected
    if options.get("wedlm_lossless"):  # lossless = greedy AR, whose rows end on all three
        assert set(expected) == {EOS, STOP, LENGTH}
