"""Stop strings and user stopping criteria inside multi-token commits: WeDLM stops at the token where transformers'
greedy `generate()` stops, hands each criterion what `generate()` would, and pays for the new tokens only (a stop
string reads a bounded tail; no criterion gets a copy of the sequence per token)."""

import pytest
import torch
from transformers import StoppingCriteria, StoppingCriteriaList, StopStringCriteria

from test_ecosystem import build_tokenizer
from tiny_models import MASK_ID, tiny_model

PROMPTS = ["w33", "w20 w21", "w7 w8 w9"]
GREEDY = dict(do_sample=False, max_new_tokens=24, eos_token_id=[])
LOOKUP = dict(decoding="wedlm", wedlm_lossless=True, wedlm_prompt_lookup=True, mask_token_id=MASK_ID)
"""Lossless with prompt lookup: token-identical to greedy, and its verified drafts commit several tokens a step."""


@pytest.fixture(scope="module")
def tokenizer():
    tokenizer = build_tokenizer()
    tokenizer.padding_side = "left"
    return tokenizer


@pytest.fixture(scope="module")
def model():
    return tiny_model("wedlm", peak=40)


def batch(tokenizer, prompts=PROMPTS) -> dict:
    return dict(tokenizer(prompts, return_tensors="pt", padding=True))


def mid_commit_strings(tokenizer, tokens: list[int], commit_steps: list[int], prompt: list[int]) -> list[str]:
    """Stop strings ending inside a multi-token commit: three tokens' text, whole or from inside the first, and one
    that starts in the prompt."""
    t = next(t for t in range(2, len(tokens) - 1) if commit_steps[t - 1] == commit_steps[t] == commit_steps[t + 1])
    text = tokenizer.decode(tokens[t - 2 : t + 1])
    return [text, text[2:], tokenizer.decode(prompt[-1:] + tokens[:2])[1:]]


@pytest.mark.parametrize("which", range(3))
def test_lossless_stop_strings_equal_greedy_generate(model, tokenizer, which):
    """A batch whose rows stop at different tokens, some inside a commit of several: the same ids, padding
    included, as transformers' greedy `generate(stop_strings=...)`."""
    inputs = batch(tokenizer)
    unstopped = model.generate(**inputs, **GREEDY, **LOOKUP, return_dict_in_generate=True)
    width = inputs["input_ids"].shape[1]
    steps = unstopped.wedlm_stats.commit_steps
    strings = [
        mid_commit_strings(tokenizer, row[width:].tolist(), steps[i], row[:width].tolist())[which]
        for i, row in enumerate(unstopped.sequences) if len(set(steps[i])) < len(steps[i])
    ]
    options = dict(**inputs, **GREEDY, stop_strings=strings, tokenizer=tokenizer)
    expected = model.generate(**options)
    assert not torch.equal(expected, unstopped.sequences)
    assert torch.equal(model.generate(**options, **LOOKUP), expected)


def first_firing(criterion: StoppingCriteria, prompt: list[int], tokens: list[int]) -> int:
    """The number of tokens AR decoding keeps: up to the first whose full prefix `criterion` fires on."""
    return next(t + 1 for t in range(len(tokens)) if criterion(torch.tensor([prompt + tokens[: t + 1]]), None).any())


def test_plain_stop_strings_cut_where_the_criterion_first_fires(model, tokenizer):
    """Plain WeDLM commits several tokens most steps: each stop string cuts its output at the first token after
    which transformers' own criterion, handed the whole prefix, fires."""
    prompt = tokenizer(PROMPTS[2]).input_ids
    unstopped = model.generate(torch.tensor([prompt]), decoding="wedlm", **GREEDY, return_dict_in_generate=True)
    tokens, steps = unstopped.sequences[0, len(prompt) :].tolist(), unstopped.wedlm_stats.commit_steps[0]
    for string in mid_commit_strings(tokenizer, tokens, steps, prompt):
        kept = first_firing(StopStringCriteria(tokenizer, [string]), prompt, tokens)
        stopped = model.generate(torch.tensor([prompt]), decoding="wedlm", **GREEDY, stop_strings=[string],
                                 tokenizer=tokenizer)
        assert stopped[0, len(prompt) :].tolist() == tokens[:kept], string


def test_stop_strings_read_a_bounded_tail(model, tokenizer, monkeypatch):
    """After a 60-token prompt, the criterion is handed at most its `maximum_token_len` last ids per token, all of
    a commit's tokens in one call: not the sequence, rebuilt for every token."""
    handed, check = [], StopStringCriteria.__call__

    def recorded(criterion, input_ids, scores, **kwargs):
        handed.append(input_ids.shape)
        return check(criterion, input_ids, scores, **kwargs)

    monkeypatch.setattr(StopStringCriteria, "__call__", recorded)
    prompt = torch.tensor([[7 + i % 80 for i in range(60)]])
    never = "w8 w8 w8 w8"
    out = model.generate(prompt, decoding="wedlm", **GREEDY, stop_strings=[never], tokenizer=tokenizer,
                         return_dict_in_generate=True)
    assert all(width <= len(never) for _, width in handed)
    assert sum(rows for rows, _ in handed) == out.wedlm_stats.generated[0] == GREEDY["max_new_tokens"]
    assert len(handed) == len(set(out.wedlm_stats.commit_steps[0])) < GREEDY["max_new_tokens"]


class Recorder(StoppingCriteria):
    """Records every prefix it is handed, and fires once it is `stop` ids long (a stand-in for a user's own
    criterion, whose reach is unknown)."""

    def __init__(self, stop: int):
        self.stop, self.prefixes, self.buffers = stop, [], set()

    def __call__(self, input_ids, scores, **kwargs):
        self.prefixes.append(input_ids[0].tolist())
        self.buffers.add(input_ids.untyped_storage().data_ptr())
        return torch.full(input_ids.shape[:1], input_ids.shape[1] == self.stop)


def test_user_criteria_are_handed_what_generate_hands_them(model, tokenizer):
    """A criterion of unknown reach sees every prefix greedy `generate()` shows it, in order, up to a stop inside a
    multi-token commit; each a view of the output, never a copy per token."""
    prompt = tokenizer(PROMPTS[0], return_tensors="pt").input_ids
    unstopped = model.generate(prompt, **GREEDY, **LOOKUP, return_dict_in_generate=True)
    steps = unstopped.wedlm_stats.commit_steps[0]
    t = next(t for t in range(len(steps) - 1) if steps[t] == steps[t + 1])
    by_generate, by_wedlm = Recorder(prompt.shape[1] + t + 1), Recorder(prompt.shape[1] + t + 1)
    expected = model.generate(prompt, **GREEDY, stopping_criteria=StoppingCriteriaList([by_generate]))
    assert torch.equal(expected, unstopped.sequences[:, : prompt.shape[1] + t + 1])
    out = model.generate(prompt, **GREEDY, **LOOKUP, stopping_criteria=StoppingCriteriaList([by_wedlm]))
    assert torch.equal(out, expected)
    assert by_wedlm.prefixes == by_generate.prefixes
    assert len(by_wedlm.buffers) == 1
