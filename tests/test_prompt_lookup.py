"""Drafts from the context (`wedlm_prompt_lookup=True`): lossless output stays transformers' greedy `generate()`,
and on text that repeats, more tokens come per forward than from the mask predictions alone."""

import pytest
import torch
from test_continuous_batching import assert_alone_equal, run_staggered, server_config
from tiny_models import MASK_ID, random_prompts, tiny_model

import wedlm_hf
from wedlm_hf.continuous import GenerationRequest, WeDLMScheduler
from wedlm_hf.generation import fill, lookup


def _repeating_prompts(seed: int):
    """Left-padded prompts whose last 8 tokens repeat earlier text."""
    input_ids, attention_mask = random_prompts([12, 20, 7], seed=seed)
    input_ids = torch.cat([input_ids, input_ids[:, -8:]], 1)
    return input_ids, torch.cat([attention_mask, torch.ones_like(attention_mask[:, -8:])], 1)


def _lossless(model, input_ids, attention_mask, **options):
    return model.generate(
        input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=40, decoding="wedlm",
        wedlm_lossless=True, mask_token_id=MASK_ID, return_dict_in_generate=True, **options,
    )


@pytest.mark.parametrize("family", ["wedlm", "llama", "qwen3"])
@pytest.mark.parametrize("schedule", ["adaptive", "full"])
def test_prompt_lookup_equals_greedy_and_pays_on_repeating_text(family, schedule):
    model = wedlm_hf.enable(tiny_model(family, seed=1, peak=40))
    input_ids, attention_mask = _repeating_prompts(seed=1)
    greedy = model.generate(input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=40, do_sample=False)
    alone = _lossless(model, input_ids, attention_mask, wedlm_draft_schedule=schedule)
    both = _lossless(model, input_ids, attention_mask, wedlm_draft_schedule=schedule, wedlm_prompt_lookup=True)
    assert torch.equal(alone.sequences, greedy) and torch.equal(both.sequences, greedy)
    per_forward = {
        name: output.wedlm_stats.summary()["tokens_per_forward_row_mean"]
        for name, output in (("alone", alone), ("both", both))
    }
    assert per_forward["both"] > per_forward["alone"], per_forward


def _self_continuing_prompts(model, seed: int = 3):
    """Left-padded prompts, each a random prompt followed by the first 9 tokens of its greedy continuation: where
    that continuation cycles, the prompt's last n-gram occurred before, followed by what greedy decodes next."""
    input_ids, attention_mask = random_prompts([5, 9, 3], seed=seed)
    greedy = model.generate(input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=9, do_sample=False)
    return greedy, torch.cat([attention_mask, torch.ones_like(greedy[:, -9:])], 1)


def _prefill_accepted(prompt: list[int], greedy: list[int], ngram: int = 2, tokens: int = 10) -> int:
    """The reference count of prompt lookup drafts the first forward accepts: the tokens after the latest earlier
    occurrence of the prompt's longest repeated last n-gram (of at most `ngram`, at least `SHORTEST_MATCH` on a
    CPU), as far as greedy decodes them."""
    for size in range(min(ngram, len(prompt) - 1), min(lookup.SHORTEST_MATCH["cpu"], ngram) - 1, -1):
        starts = [i for i in range(len(prompt) - size) if prompt[i : i + size] == prompt[-size:]]
        if starts:
            drafts = prompt[starts[-1] + size :][:tokens]
            return next((i for i, (a, b) in enumerate(zip(drafts, greedy)) if a != b), len(drafts))
    return 0


@pytest.mark.parametrize("family", ["wedlm", "llama"])
@pytest.mark.parametrize("schedule", ["adaptive", "full"])
def test_prompt_lookup_drafts_are_verified_in_the_prefill(family, schedule):
    """The first forward checks the prompt's own continuation: it commits the drafts greedy agrees with and the
    token after them (their commit step is the first certain token's), and the output stays greedy's, in a padded
    batch and alone (against transformers' `prompt_lookup_num_tokens` generate)."""
    model = wedlm_hf.enable(tiny_model(family, seed=1, peak=40))
    input_ids, attention_mask = _self_continuing_prompts(model)
    greedy = model.generate(input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=40, do_sample=False)
    options = dict(wedlm_draft_schedule=schedule)
    output = _lossless(model, input_ids, attention_mask, **options, wedlm_prompt_lookup=True)
    alone = _lossless(model, input_ids, attention_mask, **options)
    assert torch.equal(output.sequences, greedy)
    expected = [
        _prefill_accepted(prompt[mask.bool()].tolist(), row[input_ids.shape[1] :].tolist())
        for prompt, mask, row in zip(input_ids, attention_mask, greedy)
    ]
    assert max(expected) >= 3 and min(expected) == 0, expected  # rows that match in the prefill, and rows that don't
    first_step = [steps.count(steps[0]) for steps in output.wedlm_stats.commit_steps]
    assert first_step == [1 + accepted for accepted in expected]
    assert [steps.count(steps[0]) for steps in alone.wedlm_stats.commit_steps] == [1, 1, 1]
    for prompt, mask in zip(input_ids, attention_mask):
        prompt = prompt[mask.bool()][None]
        lookup = model.generate(input_ids=prompt, max_new_tokens=40, do_sample=False, prompt_lookup_num_tokens=10)
        one = _lossless(model, prompt, torch.ones_like(prompt), **options, wedlm_prompt_lookup=True)
        assert torch.equal(one.sequences, lookup)
        steps = one.wedlm_stats.commit_steps[0]
        assert steps.count(steps[0]) == 1 + _prefill_accepted(prompt[0].tolist(), lookup[0, prompt.shape[1] :].tolist())


def test_prefill_drafts_under_static_shapes_with_scores():
    """The prefill's committed drafts keep their K/V on the pool of `wedlm_static` too, and carry the scores and
    logits greedy `generate()` reports for them."""
    model = wedlm_hf.enable(tiny_model("wedlm", seed=1, peak=40))
    input_ids, attention_mask = _self_continuing_prompts(model)
    options = dict(return_dict_in_generate=True, output_scores=True, output_logits=True)
    greedy = model.generate(
        input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=40, do_sample=False, **options
    )
    options = dict(wedlm_prompt_lookup=True, output_scores=True, output_logits=True)
    dynamic = _lossless(model, input_ids, attention_mask, **options)
    static = _lossless(model, input_ids, attention_mask, wedlm_static=True, **options)
    assert torch.equal(static.sequences, greedy.sequences) and torch.equal(dynamic.sequences, greedy.sequences)
    assert static.wedlm_stats == dynamic.wedlm_stats
    assert max(steps.count(steps[0]) for steps in static.wedlm_stats.commit_steps) > 1  # drafts passed in the prefill
    for kind in ("scores", "logits"):
        for row, generated in enumerate(static.wedlm_stats.generated):
            for ours, theirs in zip(getattr(static, kind)[:generated], getattr(greedy, kind)[:generated]):
                assert torch.allclose(ours[row], theirs[row], atol=1e-4), (kind, row)


def test_prefill_drafts_of_requests_joining_a_running_batch():
    """Continuous batching runs a request's first step through the same policy: each request decodes what a
    `generate` call of its own decodes (tokens and statistics, the prefill's commits included), greedy's tokens."""
    model = wedlm_hf.enable(tiny_model("wedlm", seed=1, peak=40))
    input_ids, attention_mask = _self_continuing_prompts(model)
    prompts = [prompt[mask.bool()].tolist() for prompt, mask in zip(input_ids, attention_mask)]
    config = server_config(model, wedlm_lossless=True, wedlm_prompt_lookup=True)
    requests = [GenerationRequest(prompt, 16, request_id=str(i)) for i, prompt in enumerate(prompts)]
    results = run_staggered(WeDLMScheduler(model, config, max_batch_size=3), requests, [0, 2, 3])
    assert_alone_equal(model, config, requests, results)
    for request in requests:
        greedy = model.generate(input_ids=torch.tensor([request.input_ids]), max_new_tokens=16, do_sample=False)
        assert results[request.request_id].tokens == greedy[0, len(request.input_ids) :].tolist()
    assert max(result.stats.commit_steps[0].count(result.stats.commit_steps[0][0]) for result in results.values()) > 1


def test_prompt_lookup_searches_alike_without_host_reads(monkeypatch):
    """On an accelerator the search spans every output column instead of reading the longest context's length:
    the same drafts, so the same tokens and statistics."""
    model = wedlm_hf.enable(tiny_model("wedlm", seed=1, peak=40))
    input_ids, attention_mask = _repeating_prompts(seed=1)
    read = _lossless(model, input_ids, attention_mask, wedlm_prompt_lookup=True)
    monkeypatch.setattr(fill, "HOST_READS_ARE_FREE", ())
    unread = _lossless(model, input_ids, attention_mask, wedlm_prompt_lookup=True)
    assert torch.equal(read.sequences, unread.sequences) and read.wedlm_stats == unread.wedlm_stats


@pytest.mark.parametrize("ngram,tokens", [(1, 3), (3, 10)])
def test_prompt_lookup_sizes_keep_output_exact_under_processors(ngram, tokens):
    model = wedlm_hf.enable(tiny_model("qwen3", seed=2, peak=40))
    input_ids, attention_mask = _repeating_prompts(seed=2)
    options = dict(max_new_tokens=40, do_sample=False, repetition_penalty=1.2, no_repeat_ngram_size=4)
    greedy = model.generate(input_ids=input_ids, attention_mask=attention_mask, **options)
    output = model.generate(
        input_ids=input_ids, attention_mask=attention_mask, **options, decoding="wedlm", wedlm_lossless=True,
        mask_token_id=MASK_ID, wedlm_prompt_lookup=True, wedlm_prompt_lookup_ngram=ngram,
        wedlm_prompt_lookup_tokens=tokens,
    )
    assert torch.equal(output, greedy)


@pytest.mark.parametrize(
    "options, message",
    [
        (dict(wedlm_prompt_lookup=True), "wedlm_lossless=True"),
        (dict(wedlm_lossless=True, wedlm_prompt_lookup="yes"), "wedlm_prompt_lookup"),
        (dict(wedlm_lossless=True, wedlm_prompt_lookup_ngram=2), "wedlm_prompt_lookup=True"),
        (dict(wedlm_lossless=True, wedlm_prompt_lookup=True, wedlm_prompt_lookup_ngram=0), "integer >= 1"),
        (dict(wedlm_lossless=True, wedlm_prompt_lookup=True, wedlm_prompt_lookup_tokens=2.5), "integer >= 1"),
        (dict(wedlm_lossless=True, wedlm_prompt_lookup_min_ngram=1), "wedlm_prompt_lookup=True"),
        (dict(wedlm_lossless=True, wedlm_prompt_lookup=True, wedlm_prompt_lookup_min_ngram=3),
         r"`wedlm_prompt_lookup_min_ngram=3` is longer than `wedlm_prompt_lookup_ngram=2`"),
    ],
)
def test_prompt_lookup_options_are_validated(options, message):
    model = wedlm_hf.enable(tiny_model("wedlm", peak=40))
    input_ids, attention_mask = random_prompts([4])
    with pytest.raises(ValueError, match=message):
        model.generate(
            input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=4, decoding="wedlm", **options
        )


def _reference_lookup(
    context: list[int], history: list[list[int]], ngram: int, tokens: int, matches: int, shortest: int = 1
):
    """Per the docstring of `PromptLookup.continuation`, one row in plain Python: the continuations of the longest
    n-gram ending the context (of at least `shortest` tokens, or `ngram` if fewer) that occurred strictly before in
    it (the latest, the earliest unless it is among the latest ones taken, then the next latest), else the latest
    in a history text (a longer match there wins; a tie stays the row's own)."""
    for size in range(min(ngram, len(context)), min(shortest, ngram) - 1, -1):
        last = context[-size:]
        starts = [s for s in range(len(context) - size) if context[s : s + size] == last]
        if starts:
            latest = sorted(starts, reverse=True)[: max(matches - 1, 1)]
            picks = [latest[0], None if min(starts) in latest else min(starts), *latest[1:]][:matches]
            picks += [None] * (matches - len(picks))
            return [[] if s is None else context[s + size :][:tokens] for s in picks]
        found = [(text, s) for text in history for s in range(len(text) - size + 1) if text[s : s + size] == last]
        if found:
            text, s = found[-1]
            return [text[s + size :][:tokens]] * matches
    return [[]] * matches


def test_lookup_finds_the_longest_latest_earliest_and_next_latest_matches():
    """The vectorised search (every n-gram size in one pass, every row at once) against a plain Python search, on
    left-padded rows of a small vocabulary (many matches), before the first forward and after, with a history;
    with every match drafting, with the CPU's shortest match (2 tokens, unless `ngram` is 1) and longer ones."""
    from types import SimpleNamespace

    from wedlm_hf.generation.lookup import PromptLookup

    generator = torch.Generator().manual_seed(0)
    for trial in range(300):  # every match (as off a CPU), the CPU default, longer shortest matches
        min_ngram = (1, None, 2, 3)[trial // 3 % 4]
        shortest = lookup.SHORTEST_MATCH["cpu"] if min_ngram is None else min_ngram
        rows, prompt, outputs = 3, 2 + trial % 9, 1 + trial % 7
        sequences = torch.randint(0, 4, (rows, prompt + outputs), generator=generator)
        real = torch.randint(1, prompt + 1, (rows,), generator=generator)
        generated = torch.randint(0, outputs, (rows,), generator=generator)
        window = torch.randint(0, 4, (rows, 3), generator=generator)
        history = [torch.randint(0, 4, (n,), generator=generator).tolist() for n in (trial % 7, 2 + trial % 3)]
        corpus = SimpleNamespace(tokens=torch.tensor([t for text in history for t in text + [-1]]))
        prefill, ngram, tokens, matches = trial % 4 == 0, 1 + trial % 3, 1 + trial % 5, 1 + trial % 4
        if prefill:
            generated.zero_()
        record = SimpleNamespace(prompt_length=prompt, sequences=sequences)
        state = SimpleNamespace(window=window, generated=generated, rows=torch.arange(rows), first_position=real)
        search = PromptLookup(ngram, tokens, corpus, matches, min_ngram)
        found, count = search.continuation(record, state, prefill)
        for row in range(rows):
            end = prompt + int(generated[row])
            context = sequences[row, prompt - int(real[row]) : end].tolist() + ([] if prefill else [int(window[row, 0])])
            expected = _reference_lookup(context, history, ngram, tokens, matches, shortest)
            got = [found[row, b, : count[row, b]].tolist() for b in range(matches)]
            assert got == expected, (trial, row, context, history)
