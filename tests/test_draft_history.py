"""Drafts from the requests the engine answered before (`draft_history`, continuous/history.py, searched by
generation/lookup.py): a repeated workload decodes in fewer forwards, and every request is still exactly its lone
greedy `generate()`."""

import pytest

import wedlm_hf
from test_continuous_batching import WINDOW, lone_generate, run_staggered, server_config
from tiny_models import tiny_model
from wedlm_hf.cli import main
from wedlm_hf.continuous import GenerationRequest, WeDLMScheduler
from wedlm_hf.continuous.history import SEPARATOR, RequestHistory

PROMPTS = [[5, 6, 7, 8, 9], [10, 11, 12, 13], [20, 21, 22, 23, 24, 25]]
EDITED = [[5, 6, 7, 8, 30], [10, 11, 31, 13], [20, 21, 22, 23, 24, 32]]
"""Each prompt again with one token changed: what follows its unchanged n-grams is in the history."""
BUDGET = 24

@pytest.fixture(scope="module")
def model():
    return wedlm_hf.enable(tiny_model("wedlm", seed=3, peak=6))

def second_pass(model, config, history):
    """Forwards and tokens of the edited prompts, decoded after the originals by the same scheduler."""
    scheduler = WeDLMScheduler(model, config, max_batch_size=2, draft_history=history)
    first = [GenerationRequest(p, BUDGET, request_id=f"a{i}") for i, p in enumerate(PROMPTS)]
    run_staggered(scheduler, first, [0] * len(first))
    again = [GenerationRequest(p, BUDGET, request_id=f"b{i}") for i, p in enumerate(EDITED)]
    results = run_staggered(scheduler, again, [0] * len(again))
    return [results[r.request_id] for r in again]

def test_history_drafts_cut_forwards_and_keep_the_output(model):
    config = server_config(model, wedlm_lossless=True)
    without, with_history = second_pass(model, config, None), second_pass(model, config, 4096)
    for prompt, plain, drafted in zip(EDITED, without, with_history):
        assert drafted.tokens == plain.tokens == lone_generate(model, prompt, BUDGET, config)[0]
    forwards = [sum(result.stats.forwards[0] for result in results) for results in (without, with_history)]
    accepted = sum(result.stats.accepted[0] for result in with_history)
    assert forwards[1] < forwards[0] and accepted > 0, (forwards, accepted)

def test_a_repeated_request_drafts_its_earlier_answer_in_the_prefill(model):
    """The same prompt again: its last n-gram ends the earlier prompt in the history, so the first forward already
    checks the earlier answer, and commits as much of it as the model decodes again."""
    config = server_config(model, wedlm_lossless=True)
    scheduler = WeDLMScheduler(model, config, max_batch_size=2, draft_history=4096)
    first = run_staggered(scheduler, [GenerationRequest(PROMPTS[2], BUDGET, request_id="a")], [0])["a"]
    again = run_staggered(scheduler, [GenerationRequest(PROMPTS[2], BUDGET, request_id="b")], [0])["b"]
    assert again.tokens == first.tokens == lone_generate(model, PROMPTS[2], BUDGET, config)[0]
    steps = again.stats.commit_steps[0]
    assert steps.count(steps[0]) == WINDOW and first.stats.commit_steps[0].count(steps[0]) == 1  # 3 drafts + 1


def test_history_needs_lossless_decoding(model):
    with pytest.raises(ValueError, match="`draft_history` drafts from earlier requests for lossless"):
        WeDLMScheduler(model, server_config(model), draft_history=100)

def test_history_keeps_the_newest_texts_within_its_budget():
    history = RequestHistory(10)
    history.add([1, 2, 3], [4, 5])
    history.add([6, 7], [8])
    assert history.tokens.tolist() == [1, 2, 3, 4, 5, SEPARATOR, 6, 7, 8, SEPARATOR]
    history.add([9], [])
    assert history.tokens.tolist() == [6, 7, 8, SEPARATOR, 9, SEPARATOR]
    history.add(list(range(20, 40)), [])  # alone past the budget: its newest part
    assert history.tokens.tolist() == list(range(31, 40)) + [SEPARATOR]
    with pytest.raises(ValueError, match="`draft_history`"):
        RequestHistory(0)

@pytest.mark.parametrize(
    "flags, fix", [([], "add --continuous-batching"), (["--continuous-batching"], "add --lossless")]
)
def test_serve_refuses_draft_history_it_cannot_use_before_loading(capsys, flags, fix):
    pytest.importorskip("wedlm_hf.serving", exc_type=ImportError)  # says which transformers it needs
    assert main(["serve", "--draft-history", "1000", "--port", "1", *flags]) == 1
    assert fix in capsys.readouterr().err
