"""Lossless mode is exactly transformers' greedy AR decoding, while verifying parallel drafts."""

import math
from dataclasses import replace

import pytest
import torch
from tiny_models import MASK_ID, random_prompts, tiny_model

import wedlm_hf
from wedlm_hf.generation.draft_schedule import FIRST_AR_RUN, LOSS_BOUND, MEMORY, TRY_ALLOWANCE, DraftSchedule
from wedlm_hf.generation.forward_cost import ForwardCost
from wedlm_hf.generation.settings import WeDLMSettings
from wedlm_hf.generation.window import swap_in


def settings(scale: float | None = None) -> WeDLMSettings:
    return WeDLMSettings(16, None, 0.0, MASK_ID, lossless=True, forward_scale=scale)


TOKENS_PER_TRY = int(
    DraftSchedule.starting(torch.zeros(3, dtype=torch.long), False, settings()).prices(3).tokens_per_try
)
"""Where drafts never pass, the AR tokens whose `LOSS_BOUND` pays for a try, for a row of a batch of 3 on the CPU."""


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


def _lossless(model, input_ids, attention_mask, schedule, **options):
    return model.generate(
        input_ids=input_ids,
        attention_mask=attention_mask,
        decoding="wedlm",
        wedlm_lossless=True,
        wedlm_draft_schedule=schedule,
        mask_token_id=MASK_ID,
        return_dict_in_generate=True,
        **{"max_new_tokens": 40, **options},
    )


@pytest.mark.parametrize("family", ["wedlm", "llama"])
@pytest.mark.parametrize("constant", [False, True])
def test_adaptive_and_full_draft_schedules_give_identical_tokens(family, constant):
    """The schedule decides only how many drafts are checked, never what is committed: both equal greedy. Drafts
    that keep failing (a random model) shrink the adaptive window; drafts that keep passing grow it."""
    model = wedlm_hf.enable(tiny_model(family, seed=4, peak=40))
    if constant:
        with torch.no_grad():
            model.lm_head.weight.zero_()
    input_ids, attention_mask = random_prompts([7, 3, 10], seed=4)
    new_tokens = 40 + TOKENS_PER_TRY  # a row at zero drafts tries first after these (when its drafts saved nothing)
    greedy = model.generate(input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=new_tokens, decoding="ar")
    adaptive = _lossless(model, input_ids, attention_mask, "adaptive", max_new_tokens=new_tokens)
    full = _lossless(model, input_ids, attention_mask, "full", max_new_tokens=new_tokens)
    assert torch.equal(adaptive.sequences, greedy) and torch.equal(full.sequences, greedy)
    fed_per_forward = {
        name: sum(out.wedlm_stats.processed) / sum(out.wedlm_stats.forwards)
        for name, out in (("adaptive", adaptive), ("full", full))
    }
    if constant:  # uniform predictions are no confident drafts (and llama is not WeDLM-trained): the schedule
        # starts at zero drafts, so an AR run comes before the first try, then the limit doubles: the last 40
        # tokens take a few forwards (20 at one draft each)
        assert max(adaptive.wedlm_stats.forwards) <= TOKENS_PER_TRY + 10
    else:
        assert adaptive.wedlm_stats.summary()["accepted"] < adaptive.wedlm_stats.summary()["drafted"]
        assert fed_per_forward["adaptive"] < fed_per_forward["full"] / 2


def test_failing_drafts_are_tried_at_the_rationed_rate():
    """A model not trained for WeDLM starts at zero drafts, and where its drafts never pass it tries one after
    `FIRST_AR_RUN` tokens, then as its tries' cost stays within `TRY_ALLOWANCE` AR forwards plus `LOSS_BOUND` of
    its AR decoding (one try per `TOKENS_PER_TRY` tokens): each failed try costs two wider forwards, so the ration
    bounds what lossless mode loses against AR. Batched rows are rationed each."""
    model = wedlm_hf.enable(tiny_model("llama", seed=4, peak=40))
    input_ids, attention_mask = random_prompts([7, 3, 10], seed=4)
    new_tokens = TOKENS_PER_TRY + 40
    options = dict(max_new_tokens=new_tokens, eos_token_id=None)  # every row runs the whole budget
    greedy = model.generate(input_ids=input_ids, attention_mask=attention_mask, decoding="ar", **options)
    output = _lossless(model, input_ids, attention_mask, "adaptive", **options)
    assert torch.equal(output.sequences, greedy)
    stats = output.wedlm_stats
    for drafted, accepted, generated in zip(stats.drafted, stats.accepted, stats.generated):
        assert accepted == 0  # the premise: a random model's drafts fail
        assert 2 <= drafted <= (generated + TRY_ALLOWANCE / LOSS_BOUND) // TOKENS_PER_TRY


def test_the_first_try_waits_until_the_row_s_ar_decoding_pays_for_it():
    """The declared CPU model prices a try below `TRY_ALLOWANCE` AR forwards, so a row starting at zero drafts tries
    first after `FIRST_AR_RUN` tokens; where a profile measured a wider forward's premium (two wide forwards then
    cost more than the allowance), its first try is rationed like the others, and a short answer tries none."""
    generated = torch.zeros(1, dtype=torch.long)
    assert DraftSchedule.starting(generated, False, settings()).try_at.tolist() == [FIRST_AR_RUN]
    dear = replace(settings(), forward_scale=ForwardCost.declared("cpu", 16, premium=1.0))
    schedule = DraftSchedule.starting(generated, False, dear)
    per_try = schedule.prices(1).tokens_per_try
    assert per_try * LOSS_BOUND > TRY_ALLOWANCE
    assert schedule.try_at.tolist() == [math.ceil(per_try - TRY_ALLOWANCE / LOSS_BOUND)]


def _schedule(passed: list[float], failed: list[float], scale: float | None = None):
    generated = torch.full((len(passed),), 10)
    schedule = DraftSchedule.starting(generated, True, settings(scale))
    schedule.passed, schedule.failed = torch.tensor(passed), torch.tensor(failed)
    return schedule


def test_the_batch_width_is_what_expected_acceptance_pays_for_at_the_batch_size():
    """Drafts that always pass pay for the most slots at batch 1 and for none at batch 32 on a CPU (2d + 2 columns
    for 32 rows cost more than d + 1 tokens per row return); at batch 8 drafts passing 9 times in 10 pay for a few,
    3 in 4 for none, which pay at batch 1; a row whose drafts fail checks none, unless the other rows' drafts pay
    for the batch's columns."""
    assert int(_schedule([9.0], [0.0]).widths()[0]) == 14
    assert int(_schedule([0.0], [2.0]).widths()[0]) == 0
    assert int(_schedule([9.0] * 32, [0.0] * 32).widths()[0]) == 0
    assert 2 < int(_schedule([9.0] * 8, [1.0] * 8).widths()[0]) < 8
    assert int(_schedule([3.0] * 8, [1.0] * 8).widths()[0]) == 0
    assert int(_schedule([3.0], [1.0]).widths()[0]) > 2
    assert int(_schedule([9.0, 0.0], [0.0, 2.0]).widths()[0]) == 14
    assert int(_schedule([9.0] * 32, [0.0] * 32, scale=2048).widths()[0]) == 14  # where a wide forward is cheap


def test_rows_joining_a_running_batch_are_priced_at_its_size_until_they_join():
    """A continuous-batching group decodes its first forward alone, then joins the running rows: its first widths
    are priced at the joined batch's size (none pays at 32 on a CPU), the joined schedule at its own rows'."""
    generated = torch.full((1,), 0)
    alone = DraftSchedule.starting(generated, True, settings())
    joining = DraftSchedule.starting(generated, True, settings(), beside=31)
    assert int(alone.draft_limit[0]) == 14 and int(joining.draft_limit[0]) == 0
    running = DraftSchedule.starting(generated, True, settings())
    swap_in([(running, running.joined(joining))])
    assert running.beside == 0 and int(running.widths()[0]) == 14  # (two rows whose drafts all pass)


def test_the_width_follows_acceptance():
    """A row's pass rate weighs its recent forwards by `MEMORY` each: a rejection of the first draft narrows the
    batch, drafts that pass widen it; a row given drafts that had none to check yet (after a rejection, or a try's
    first forward) keeps its width, and a batch where nothing pays turns AR, its next try set."""
    generated = torch.full((1,), 10)
    schedule = _schedule([3.0], [1.0])
    schedule.draft_limit = torch.tensor([7])
    schedule.adapt(torch.tensor([7]), torch.tensor([0]), torch.tensor([True]), generated, torch.tensor([0]))
    narrowed = int(schedule.draft_limit)
    assert narrowed < 7
    assert schedule.passed.tolist() == pytest.approx([3 * MEMORY])
    assert schedule.failed.tolist() == pytest.approx([1 + MEMORY])
    schedule.adapt(torch.tensor([0]), torch.tensor([0]), torch.tensor([False]), generated, torch.tensor([0]))
    assert int(schedule.draft_limit) == narrowed  # nothing checked: the width stays
    passing = torch.tensor([narrowed])
    schedule.adapt(passing, passing, torch.tensor([False]), generated, torch.tensor([0]))
    assert int(schedule.draft_limit) > narrowed
    failing = _schedule([0.0], [1.0])
    failing.draft_limit = torch.tensor([1])
    failing.adapt(torch.tensor([1]), torch.tensor([0]), torch.tensor([True]), generated, torch.tensor([0]))
    assert failing.draft_limit.tolist() == [0] and failing.try_at.tolist() == [10 + 2 * FIRST_AR_RUN]


def test_a_trained_model_checks_only_its_confident_first_drafts():
    """After the first forward the adaptive schedule checks only the leading drafts predicted below
    `CONFIDENT_ENTROPY`: uniform predictions (all logits 0) are checked by no forward before the row's first try,
    and the same drafts are checked at once when the call's entropy threshold admits them."""
    model = tiny_model("wedlm", peak=40)
    with torch.no_grad():
        model.lm_head.weight.zero_()
    input_ids, attention_mask = random_prompts([4, 8])
    options = dict(max_new_tokens=FIRST_AR_RUN, eos_token_id=None)  # ends before the first try
    greedy = model.generate(input_ids=input_ids, attention_mask=attention_mask, decoding="ar", **options)
    unconfident = _lossless(model, input_ids, attention_mask, "adaptive", **options)
    admitted = _lossless(model, input_ids, attention_mask, "adaptive", wedlm_entropy_threshold=100.0, **options)
    assert torch.equal(unconfident.sequences, greedy) and torch.equal(admitted.sequences, greedy)
    assert unconfident.wedlm_stats.drafted == [0, 0]
    assert min(admitted.wedlm_stats.drafted) > 0


def test_draft_schedule_is_validated():
    model = tiny_model("wedlm", peak=40)
    input_ids, attention_mask = random_prompts([4])
    with pytest.raises(ValueError, match="wedlm_draft_schedule.*adaptive"):
        _lossless(model, input_ids, attention_mask, "sometimes")
    with pytest.raises(ValueError, match="wedlm_lossless=True"):
        model.generate(input_ids=input_ids, attention_mask=attention_mask, decoding="wedlm", wedlm_draft_schedule="full")


@pytest.mark.parametrize("lossless", [True, False])
def test_suppressed_tokens_never_appear_and_lossless_stays_greedy(lossless):
    """`suppress_tokens` (a fine-tuned model's config uses it for its mask token) is applied to every forward's
    logits: lossless still equals greedy `generate()` with the same suppression, and no mode emits those ids."""
    model = wedlm_hf.enable(tiny_model("llama", seed=3, peak=40))
    input_ids, attention_mask = random_prompts([6, 9], seed=3)
    plain = model.generate(input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=24, do_sample=False)
    suppressed = plain[:, input_ids.shape[1] :].flatten().unique()[:3].tolist()  # tokens greedy would emit
    greedy = model.generate(
        input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=24, do_sample=False, suppress_tokens=suppressed
    )
    assert not torch.equal(greedy, plain)
    output = model.generate(
        input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=24, decoding="wedlm",
        wedlm_lossless=lossless, mask_token_id=MASK_ID, suppress_tokens=suppressed,
    )
    assert not torch.isin(output[:, input_ids.shape[1] :], torch.tensor(suppressed)).any()
    if lossless:
        assert torch.equal(output, greedy)
