"""Trees (`generation/tree.py`): prompt lookup's drafts verified as a branch beside the window's drafts in one
forward. Greedy output stays transformers' greedy `generate()` on both attention implementations that take a 4D
mask and in the engine's K/V pool, branches are really taken (also where they leave the window's drafts after
shared ones), and the recursive rejection at a branch's node draws exactly from the model's distribution."""

import pytest
import torch
from test_continuous_batching import lone_generate, run_staggered, server_config
from test_lossless_sampling import _chi_square, _critical
from test_prompt_lookup import _repeating_prompts
from tiny_models import MASK_ID, tiny_model

import wedlm_hf
from wedlm_hf.continuous import GenerationRequest, WeDLMScheduler
from wedlm_hf.generation import decoding, lossless
from wedlm_hf.generation.draws import draw
from wedlm_hf.generation.fill import SlotFiller
from wedlm_hf.generation.tree import Branch, _sampled_branch, tree_mask
from wedlm_hf.generation.verify import speculative_target


@pytest.fixture
def taken(monkeypatch):
    """Every branch verification's rows that took their branch, with their depths."""
    seen = []

    def spy(*args):
        result = verify(*args)
        branch, took = args[7], result[1]
        seen.extend(branch.depth[took].tolist())
        return result

    verify = lossless.verify_tree
    monkeypatch.setattr(lossless, "verify_tree", spy)
    return seen


def _drafts_right_but_every_fourth(monkeypatch, greedy: torch.Tensor) -> None:
    """Mask-slot drafts replaced by greedy's own tokens, except every fourth output position (a wrong token):
    windows pass up to a wrong draft, where a lookup branch may carry on (a branch of depth > 1)."""
    original = SlotFiller.fill

    def fill(self, state, *args, **kwargs):
        before = state.window.clone()
        original(self, state, *args, **kwargs)
        position = state.generated[:, None] + torch.arange(state.window.shape[1])
        right = greedy[state.rows[:, None], (self.record.prompt_length + position).clamp(max=greedy.shape[1] - 1)]
        drafted = (state.window != before) & (position < greedy.shape[1] - self.record.prompt_length)
        state.window = torch.where(drafted, torch.where(position % 4 == 3, (right + 1) % MASK_ID, right), state.window)

    monkeypatch.setattr(SlotFiller, "fill", fill)


@pytest.mark.parametrize("family, attn", [("wedlm", "sdpa"), ("llama", "eager"), ("qwen3", "sdpa")])
def test_trees_take_branches_and_keep_greedy_output(family, attn, taken, monkeypatch):
    model = wedlm_hf.enable(tiny_model(family, seed=1, peak=40, attn=attn))
    input_ids, attention_mask = _repeating_prompts(seed=1)
    greedy = model.generate(input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=40, do_sample=False)
    options = dict(max_new_tokens=40, decoding="wedlm", wedlm_lossless=True, mask_token_id=MASK_ID,
                   wedlm_prompt_lookup=True, wedlm_window_size=6)
    for schedule in ("full", "adaptive"):
        output = model.generate(input_ids=input_ids, attention_mask=attention_mask, wedlm_draft_schedule=schedule,
                                **options)
        assert torch.equal(output, greedy), schedule
    assert taken, "no branch was ever taken"
    _drafts_right_but_every_fourth(monkeypatch, greedy)
    taken.clear()
    output = model.generate(input_ids=input_ids, attention_mask=attention_mask, wedlm_draft_schedule="full", **options)
    assert torch.equal(output, greedy)
    assert max(taken) > 1, "no branch left the window's drafts after shared ones"


def test_trees_are_off_where_a_verified_score_reads_the_prefix(taken):
    """Processors that read the prefix (here a repetition penalty, which per-row sampling would take, plus an
    n-gram ban, which it cannot) keep lookup on the window's chain: output still greedy's."""
    model = wedlm_hf.enable(tiny_model("qwen3", seed=2, peak=40))
    input_ids, attention_mask = _repeating_prompts(seed=2)
    options = dict(max_new_tokens=30, do_sample=False, no_repeat_ngram_size=4)
    greedy = model.generate(input_ids=input_ids, attention_mask=attention_mask, **options)
    output = model.generate(
        input_ids=input_ids, attention_mask=attention_mask, **options, decoding="wedlm", wedlm_lossless=True,
        mask_token_id=MASK_ID, wedlm_prompt_lookup=True,
    )
    assert torch.equal(output, greedy) and not taken


def test_trees_in_the_engines_pool_keep_every_request_greedy(taken):
    model = wedlm_hf.enable(tiny_model("wedlm", seed=1, peak=40))
    config = server_config(model, wedlm_lossless=True, wedlm_prompt_lookup=True, wedlm_draft_schedule="full")
    generator = torch.Generator().manual_seed(3)
    texts = [torch.randint(3, MASK_ID, (length,), generator=generator).tolist() for length in (12, 20, 9)]
    prompts = [text + text[:8] for text in texts]  # ends repeating its start
    requests = [GenerationRequest(prompt, 30, request_id=str(i)) for i, prompt in enumerate(prompts)]
    scheduler = WeDLMScheduler(model, config, max_batch_size=2)
    results = run_staggered(scheduler, requests, [0, 2, 5])
    for i, prompt in enumerate(prompts):
        assert results[str(i)].tokens == lone_generate(model, prompt, 30, config)[0]
    assert taken


def test_trees_need_a_4d_mask_and_free_shapes():
    model = tiny_model("llama", seed=1)
    setup = decoding.prepare_decoding(model, model.generation_config, mask_token_id=MASK_ID, wedlm_lossless=True)
    record = setup.output_record(torch.ones(1, 3, dtype=torch.long), [4], model.generation_config, [])
    assert decoding.trees_allowed(model, setup.settings, setup.processors, record, do_sample=False)
    model.config._attn_implementation = "flash_attention_2"
    assert not decoding.trees_allowed(model, setup.settings, setup.processors, record, do_sample=False)


def test_tree_mask_lets_a_branch_see_its_ancestors_only():
    # two branch columns diverging at slot 2 (ancestors: window columns 0 and 1), a window of three columns
    mask = tree_mask(torch.tensor([2]), branch_width=2, fed=3)[0].int().tolist()
    assert mask == [
        [1, 0, 1, 1, 0],
        [1, 1, 1, 1, 0],
        [0, 0, 1, 0, 0],
        [0, 0, 1, 1, 0],
        [0, 0, 1, 1, 1],
    ]


def test_recursive_rejection_at_a_branch_node_draws_the_models_distribution():
    """At the node where a branch leaves the window: the window's draft x ~ q passes with min(1, p/q); then the
    branch token b passes with the residual's probability of it; else a draw from the residual without b. The first
    token emitted there must be distributed as p, and b's continuation as p after b."""
    draws, generator = 60000, torch.Generator().manual_seed(5)
    p = torch.tensor([0.05, 0.3, 0.25, 0.1, 0.2, 0.1])
    q = torch.tensor([0.4, 0.1, 0.05, 0.25, 0.1, 0.1])
    after_b = torch.tensor([0.5, 0.1, 0.1, 0.1, 0.1, 0.1])
    x = torch.multinomial(q.expand(draws, -1), 1, generator=generator)
    b = 2  # the branch token (a likely one, so its continuation is often reached)
    accepted, target = speculative_target(
        torch.stack([p, p]).expand(draws, -1, -1), x, torch.ones(draws, dtype=torch.long), q.expand(draws, 1, -1),
        torch.ones(draws, 1, dtype=torch.bool), torch.rand(draws, 1, generator=generator),
    )
    branch = Branch(torch.tensor([[b, 0]]).expand(draws, -1), torch.ones(draws, dtype=torch.long),
                    torch.full((draws,), 2))
    branch_probs = torch.stack([after_b, p]).expand(draws, -1, -1)
    uniform = torch.rand(draws, 2, generator=generator)
    in_branch = torch.ones(draws, 2, dtype=torch.bool)
    took, taken, final = _sampled_branch(target, accepted, branch, branch.tokens, in_branch, branch_probs, uniform)
    last = draw(final[:, None], torch.rand(draws, 1, generator=generator))[:, 0]
    first = torch.where(accepted > 0, x[:, 0], torch.where(took, b, last))
    second = torch.where(taken > 1, 0, last)[took]  # after a taken b: its continuation 0 passed, or a draw
    assert bool((~took | (accepted == 0)).all())  # the branch is tried only after the window's draft failed
    for tokens, probs in ((first, p), (second, after_b)):
        counts = torch.bincount(tokens, minlength=6).tolist()
        exact = {(0, t): float(probs[t]) for t in range(6)}
        statistic, df = _chi_square({(0, t): c for t, c in enumerate(counts)}, exact, len(tokens))
        assert statistic < _critical(df + 1), (statistic, counts)
