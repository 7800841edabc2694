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
from transformers import LogitsProcessorList

import wedlm_hf
from wedlm_hf.continuous import GenerationRequest, WeDLMScheduler
from wedlm_hf.generation import decoding, tree
from wedlm_hf.generation.draws import draw
from wedlm_hf.generation.fill import SlotFiller
from wedlm_hf.generation.tree import Branch, _sampled_branches, tree_mask
from wedlm_hf.generation.verify import speculative_target


@pytest.fixture
def taken(monkeypatch):
    """Every branch verification's rows that took a branch: the depth of the branch each took, and which it was."""
    seen = []

    def spy(*args):
        result = verified(*args)
        branch, took, best = args[7], result[1], result[2]
        seen.extend(zip(branch.depth.gather(1, best[:, None]).squeeze(1)[took].tolist(), best[took].tolist()))
        return result

    verified = tree.verified
    monkeypatch.setattr(tree, "verified", spy)
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


@pytest.mark.parametrize(
    "family, seed, attn, ngram, matches",
    [("wedlm", 1, "sdpa", 2, 2), ("llama", 1, "eager", 2, 2), ("qwen3", 1, "sdpa", 2, 2), ("wedlm", 3, "sdpa", 1, 4)],
)
def test_trees_take_branches_and_keep_greedy_output(family, seed, attn, ngram, matches, taken, monkeypatch):
    """Also with 4 matches of the last token (a model whose text often recurs with another ending there); every
    match drafts (`wedlm_prompt_lookup_min_ngram=1`, as off a CPU), so that each rank's branch gets taken here."""
    model = wedlm_hf.enable(tiny_model(family, seed=seed, peak=40, attn=attn))
    input_ids, attention_mask = _repeating_prompts(seed=1)
    greedy = model.generate(input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=40, do_sample=False)
    options = dict(max_new_tokens=40, decoding="wedlm", wedlm_lossless=True, mask_token_id=MASK_ID,
                   wedlm_prompt_lookup=True, wedlm_window_size=6, wedlm_prompt_lookup_ngram=ngram,
                   wedlm_prompt_lookup_matches=matches, wedlm_prompt_lookup_min_ngram=1)
    for schedule in ("full", "adaptive"):
        output = model.generate(input_ids=input_ids, attention_mask=attention_mask, wedlm_draft_schedule=schedule,
                                **options)
        assert torch.equal(output, greedy), schedule
    assert taken, "no branch was ever taken"
    indices = {index for _, index in taken}
    _drafts_right_but_every_fourth(monkeypatch, greedy)
    taken.clear()
    output = model.generate(input_ids=input_ids, attention_mask=attention_mask, wedlm_draft_schedule="full", **options)
    assert torch.equal(output, greedy)
    assert max(depth for depth, _ in taken) > 1, "no branch left the window's drafts after shared ones"
    assert indices | {index for _, index in taken} == set(range(matches)), "a match's branch was never taken"


def test_trees_are_off_where_a_verified_score_reads_the_prefix(taken, caplog):
    """Processors that read the prefix (here a repetition penalty, which per-row sampling would take, plus an
    n-gram ban, which it cannot) keep lookup on the window's chain: output still greedy's; more matches asked for
    are not silently dropped."""
    model = wedlm_hf.enable(tiny_model("qwen3", seed=2, peak=40))
    input_ids, attention_mask = _repeating_prompts(seed=2)
    options = dict(max_new_tokens=30, do_sample=False, no_repeat_ngram_size=4)
    greedy = model.generate(input_ids=input_ids, attention_mask=attention_mask, **options)
    output = model.generate(
        input_ids=input_ids, attention_mask=attention_mask, **options, decoding="wedlm", wedlm_lossless=True,
        mask_token_id=MASK_ID, wedlm_prompt_lookup=True, wedlm_prompt_lookup_matches=3,
    )
    assert torch.equal(output, greedy) and not taken
    assert any("`wedlm_prompt_lookup_matches=3`" in record.getMessage() for record in caplog.records)


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
    # two branches of two columns, leaving the window at slots 2 and 1, before a window of three columns
    mask = tree_mask(torch.tensor([[0, 0, 1, 1]]), torch.tensor([[2, 2, 1, 1]]), fed=3)[0].int().tolist()
    assert mask == [
        [1, 0, 0, 0, 1, 1, 0],
        [1, 1, 0, 0, 1, 1, 0],
        [0, 0, 1, 0, 1, 0, 0],
        [0, 0, 1, 1, 1, 0, 0],
        [0, 0, 0, 0, 1, 0, 0],
        [0, 0, 0, 0, 1, 1, 0],
        [0, 0, 0, 0, 1, 1, 1],
    ]


@pytest.mark.parametrize("second_first", [4, 2])
def test_recursive_rejection_at_a_branch_node_draws_the_models_distribution(second_first):
    """At the node where two branches leave the window: the window's draft x ~ q passes with min(1, p/q); then
    each branch's first token in turn passes with the remaining distribution's probability of it, which then
    loses it; else a draw from what remains. The first token emitted there must be distributed as p (also when
    both branches start with the same token), and a taken branch's continuation as p after its token."""
    draws, generator = 60000, torch.Generator().manual_seed(5)
    p = torch.tensor([0.05, 0.3, 0.25, 0.1, 0.2, 0.1])
    q = torch.tensor([0.4, 0.1, 0.05, 0.25, 0.1, 0.1])
    after = {2: torch.tensor([0.5, 0.1, 0.1, 0.1, 0.1, 0.1]), 4: torch.tensor([0.1, 0.6, 0.1, 0.1, 0.05, 0.05])}
    x = torch.multinomial(q.expand(draws, -1), 1, generator=generator)
    accepted, target = speculative_target(
        torch.stack([p, p]).expand(draws, -1, -1), x, torch.ones(draws, dtype=torch.long), q.expand(draws, 1, -1),
        torch.ones(draws, 1, dtype=torch.bool), torch.rand(draws, 1, generator=generator),
    )
    firsts, seconds = [2, second_first], [0, 1]  # each branch: its first token, then the one it proposes after it
    tokens = torch.tensor([[firsts[0], seconds[0]], [firsts[1], seconds[1]]]).expand(draws, -1, -1)
    two = torch.full((draws, 2), 2)
    branch = Branch(tokens, torch.ones(draws, 2, dtype=torch.long), two, two, 2)
    probs = torch.stack([torch.stack([after[first], p]) for first in firsts]).expand(draws, -1, -1, -1)
    uniform = torch.rand(draws, 2, 2, generator=generator)
    in_branch = torch.ones(draws, 2, 2, dtype=torch.bool)
    accepted, took, best, taken, final = _sampled_branches(accepted, target, branch, tokens, in_branch, probs, uniform)
    last = draw(final[:, None], torch.rand(draws, 1, generator=generator))[:, 0]
    first = torch.where(accepted > 0, x[:, 0], torch.where(took, tokens[torch.arange(draws), best, 0], last))
    assert bool((~took | (accepted == 0)).all())  # branches are tried only after the window's draft failed
    checks = [(first, p)]
    for index in range(2 if second_first != firsts[0] else 1):  # (a repeated first token is never taken twice)
        rows = took & (best == index)
        checks.append((torch.where(taken > 1, seconds[index], last)[rows], after[firsts[index]]))
    assert not bool((took & (best == 1)).any()) or second_first != firsts[0]
    for tokens_drawn, probs in checks:
        counts = torch.bincount(tokens_drawn, minlength=6).tolist()
        exact = {(0, t): float(probs[t]) for t in range(6)}
        statistic, df = _chi_square({(0, t): c for t, c in enumerate(counts)}, exact, len(tokens_drawn))
        assert statistic < _critical(df + 1), (statistic, counts)


def test_lookup_leaves_the_adaptive_limit_to_the_mask_drafts(monkeypatch):
    """On a WeDLM-trained model the draft limit follows the mask predictions' drafts alone, also after the prefill
    drafted from the prompt: lookup drafts are branches from then on, so the window shrinks where its drafts fail
    (a window kept at its widest would feed ~3x the slots)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from wedlm_hf.generation.draft_schedule import DraftSchedule

    model = AutoModelForCausalLM.from_pretrained(wedlm_hf.DEFAULT_MODEL).eval()
    tokenizer = AutoTokenizer.from_pretrained(wedlm_hf.DEFAULT_MODEL)
    text = "def area(width, height):\n    return width * height\n\n\ndef area(width, height):\n    return"
    input_ids = tokenizer(text, return_tensors="pt").input_ids
    adapted = []
    adapt = DraftSchedule.adapt
    monkeypatch.setattr(DraftSchedule, "adapt", lambda self, drafts, *rest: adapted.append(int(drafts.sum())) or
                        adapt(self, drafts, *rest))
    options = dict(max_new_tokens=40, decoding="wedlm", wedlm_lossless=True, return_dict_in_generate=True)
    output = model.generate(input_ids, wedlm_prompt_lookup=True, **options)
    greedy = model.generate(input_ids, max_new_tokens=40, do_sample=False, decoding="ar")
    assert torch.equal(output.sequences, greedy)
    assert sum(adapted) > 0, adapted  # the schedule saw the window's drafts


def test_a_rows_branch_draws_do_not_depend_on_the_batchs_widest_branch():
    """Rows sampling with their own keys draw the same at a branch node whatever the other rows' branches are
    (continuous batching: a seeded request samples the same beside any other)."""
    from types import SimpleNamespace

    from wedlm_hf.generation.sampling import RowSampling, SamplingParams
    from wedlm_hf.generation.verify import Verifier

    rows, vocab, generator = 400, 6, torch.Generator().manual_seed(2)
    params = [SamplingParams(temperature=1.0, top_k=0, seed=seed) for seed in range(rows + 1)]
    scores = torch.randn(rows + 1, 4, vocab, generator=generator)
    branch_logits = torch.randn(rows + 1, 8, vocab, generator=generator)

    def decided(count: int):
        """The first `rows` rows' verification in a batch of `count` rows (the last one's branches are wider)."""
        sampling = RowSampling.for_requests(params[:count], "cpu", mask_id=0)
        record = SimpleNamespace(sampling=sampling, forward_numbers=lambda state: torch.zeros(count, dtype=torch.long))
        state = SimpleNamespace(rows=torch.arange(count))
        tokens = torch.tensor([[[1, 2, 3, 4], [2, 3, 4, 5]]]).repeat(count, 1, 1)
        branch_count = torch.tensor([[1, 2]]).repeat(count, 1)
        branch_count[rows:] = 4  # the wide row: 8 branch columns instead of 3
        branch = Branch(tokens, torch.ones(count, 2, dtype=torch.long), branch_count, torch.full((count, 2), 4), 4)
        width = int(branch_count.sum(1).max())
        drafts, none = torch.zeros(count, 3, dtype=torch.long), torch.zeros(count, dtype=torch.long)
        verifier = Verifier(LogitsProcessorList(), record, do_sample=True)
        result = tree.verified(verifier, state, scores[:count], None, drafts, none, torch.ones(count, 3, vocab) / vocab,
                               branch, branch_logits[:count, :width])
        return [value[:rows] for value in result]

    alone, beside = decided(rows), decided(rows + 1)
    assert alone[1].any() and (alone[2] == 1).any()  # branches taken, the second one too
    for mine, theirs in zip(alone, beside):
        assert torch.equal(mine, theirs)


def test_a_branch_is_dropped_only_where_an_earlier_one_holds_it_whole():
    """`Branch.propose`: each continuation starts where it leaves the window's drafts; one whose tokens an earlier
    branch at the same depth holds whole never commits more, so it feeds no columns; one sharing only a prefix
    with an earlier one (the same first token, another ending) is kept, and so is one at another depth."""
    mask = 99
    window = torch.tensor([[7, 5, mask, mask, mask, mask]])
    continuations = torch.tensor([[[5, 1, 2, 3], [5, 1, 2, 9], [5, 1, 2, 0], [1, 2, 0, 0], [5, 1, 2, 3], [5, 4, 0, 0]]])
    count = torch.tensor([[4, 4, 3, 2, 4, 2]])
    branch = Branch.empty(window, 6, 4)
    branch.propose(window, mask, continuations, count, torch.tensor([6]))
    assert branch.depth.tolist() == [[2, 2, 2, 1, 2, 2]]  # (the window's slot 1 holds each one's 5 already)
    assert branch.tokens[0, :, :3].tolist() == [[1, 2, 3], [1, 2, 9], [1, 2, 0], [1, 2, 0], [1, 2, 3], [4, 0, 0]]
    assert branch.count.tolist() == [[3, 3, 0, 2, 0, 1]]


def test_a_later_branch_is_fed_as_far_as_its_rank_passes():
    """`Branch.adapt` on a CPU: the first branch (the latest match) is always fed whole; a later rank's limit
    becomes twice the tokens of its branch that passed (at least `SHORTEST_SECOND_BRANCH`, 3) after a failure,
    double plus one after its branch passed whole, and stays where the rank fed nothing; `propose` then cuts that
    rank's branches to it. On an accelerator every branch stays whole."""
    mask, size = 99, 10
    window = torch.full((4, 12), mask)
    branch = Branch.empty(window, 2, size)
    branch.count = torch.tensor([[10, 10], [10, 10], [10, 0], [10, 3]])
    branch.limit = torch.tensor([[10, 10], [10, 10], [10, 10], [10, 3]])
    took, best = torch.tensor([True, True, False, True]), torch.tensor([1, 0, 0, 1])
    branch.adapt(best, took, passed=torch.tensor([4, 10, 0, 3]))
    assert branch.shortest == tree.SHORTEST_SECOND_BRANCH["cpu"] == 3
    assert branch.limit.tolist() == [[10, 8], [10, 3], [10, 10], [10, 7]]
    continuations = torch.stack([torch.arange(size), torch.arange(size) + 20])[None].expand(4, -1, -1)
    branch.propose(window, mask, continuations, torch.full((4, 2), size), torch.full((4,), 12))
    assert branch.count.tolist() == [[10, 8], [10, 3], [10, 10], [10, 7]]
    assert Branch.empty(window.to("meta"), 2, size).shortest == size
