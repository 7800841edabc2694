"""Per-request sampling in continuous batching (generation/sampling.py): each request decodes with its own
temperature, top-k/p, min-p, penalties and seed, in one batch with requests that ask for others, and gets what it
gets alone: a greedy request its lone greedy `generate()`, a penalised one its lone penalised `generate()`, a seeded
one the same tokens whatever runs beside it (and as a one-row `generate()` after `torch.manual_seed(seed)`)."""

import pytest
import torch
from transformers import LogitsProcessorList

import wedlm_hf
from test_continuous_batching import lone_generate, run_staggered, server_config
from tiny_models import tiny_model
from wedlm_hf.continuous import GenerationRequest, WeDLMScheduler
from wedlm_hf.generation import fill
from wedlm_hf.generation.draws import draw, keyed_uniforms
from wedlm_hf.generation.penalties import OpenAIPenalties, SeenTokens
from wedlm_hf.generation.sampling import SamplingParams

PROMPTS = [[5, 6, 7, 8, 9], [10, 11, 12], [20, 21, 22, 23, 24, 25, 26, 27, 28], [30, 31], [40, 41, 42, 43], [50, 3]]
BUDGET = 14
SAMPLED = [
    SamplingParams(temperature=0.8, seed=1),
    SamplingParams(temperature=1.3, top_k=7, seed=2),
    SamplingParams(temperature=1.0, top_p=0.8, min_p=0.05, seed=3),
    SamplingParams(temperature=0.6, repetition_penalty=1.4, frequency_penalty=0.5, presence_penalty=0.3, seed=4),
]
MODES = [{}, {"wedlm_lossless": True}, {"wedlm_lossless": True, "wedlm_prompt_lookup": True}]


def decode(model, config, sampling, arrivals=None, max_batch_size=4):
    """Each (prompt, sampling) as a request of one scheduler, arriving at its step; the results in order."""
    scheduler = WeDLMScheduler(model, config, max_batch_size=max_batch_size)
    requests = [
        GenerationRequest(PROMPTS[i % len(PROMPTS)], BUDGET, request_id=str(i), sampling=params)
        for i, params in enumerate(sampling)
    ]
    results = run_staggered(scheduler, requests, arrivals or [0] * len(requests))
    assert all(results[r.request_id].error is None for r in requests)
    return [results[r.request_id].tokens for r in requests]


@pytest.fixture(scope="module")
def model():
    return wedlm_hf.enable(tiny_model("wedlm", seed=3, peak=6))


@pytest.mark.parametrize("mode", MODES, ids=["plain", "lossless", "lossless+lookup"])
def test_seeded_request_is_the_same_whatever_runs_beside_it(model, mode):
    config = server_config(model, **mode)
    mixed = [SAMPLED[0], None, SAMPLED[1], SamplingParams(repetition_penalty=1.5), SAMPLED[2], SAMPLED[3]]
    together = decode(model, config, mixed, arrivals=[0, 0, 1, 2, 3, 3])
    for i, params in enumerate(mixed):
        if params is not None and params.seed is not None:
            alone = decode(model, config, [None] * i + [params], arrivals=[0] * (i + 1))[i]
            assert together[i] == alone, (i, params)
    other_seeds = decode(model, config, [SamplingParams(temperature=1.3, seed=s) for s in range(5, 9)])
    assert len({tuple(tokens) for tokens in other_seeds}) > 1, "seeds change nothing: nothing is sampled"


@pytest.mark.parametrize("mode", MODES, ids=["plain", "lossless", "lossless+lookup"])
def test_greedy_and_penalised_requests_equal_their_lone_generate(model, mode):
    """Beside sampled requests, a greedy request (with its own repetition or OpenAI penalties) decodes what a
    `generate()` of its own decodes with those settings."""
    config = server_config(model, **mode)
    greedy = [
        SamplingParams(), SamplingParams(repetition_penalty=1.6), SamplingParams(frequency_penalty=1.5),
        SamplingParams(presence_penalty=2.0, repetition_penalty=0.7),
    ]
    mixed = [item for pair in zip(greedy, SAMPLED) for item in pair]
    results = decode(model, config, mixed, arrivals=[0, 0, 1, 1, 2, 2, 5, 5])
    for i, params in enumerate(mixed):
        if params.do_sample:
            continue
        prompt = PROMPTS[i % len(PROMPTS)]
        penalties = OpenAIPenalties(len(prompt), params.frequency_penalty, params.presence_penalty)
        options = dict(do_sample=False, repetition_penalty=params.repetition_penalty)
        if params.frequency_penalty or params.presence_penalty:
            options["logits_processor"] = LogitsProcessorList([penalties])
        tokens, _ = lone_generate(model, prompt, BUDGET, config, **options)
        assert results[i] == tokens, (i, params)
        if mode:  # lossless: also transformers' own greedy decoding with those penalties
            reference = model.generate(
                input_ids=torch.tensor([prompt]), generation_config=config, max_new_tokens=BUDGET, decoding="ar",
                **options,
            )[0, len(prompt) :].tolist()
            assert tokens == reference[: len(tokens)] and len(tokens) in (len(reference), BUDGET), (i, params)
    penalised_differ = [results[i] for i in (0, 2, 4, 6)]
    assert len({tuple(tokens) for tokens in penalised_differ}) > 1, "the penalties change nothing here"


def test_seeded_request_equals_a_one_row_generate_after_manual_seed(model):
    """`row_key`: a request seeded with s samples as `generate()` does after `torch.manual_seed(s)`."""
    config = server_config(model, wedlm_lossless=True)
    params = SamplingParams(temperature=0.9, top_k=9, seed=11)
    served = decode(model, config, [SamplingParams(temperature=1.1, seed=3), params])[1]
    torch.manual_seed(11)
    tokens, _ = lone_generate(model, PROMPTS[1], BUDGET, config, do_sample=True, temperature=0.9, top_k=9)
    assert served == tokens


def test_draw_follows_the_distribution():
    """Inverse-CDF draws from keyed uniforms: frequencies match the probabilities; a zero-probability token never
    comes."""
    keys, forwards = torch.arange(40) * 7919, torch.arange(100)
    uniform = torch.cat([keyed_uniforms(keys, torch.full_like(keys, f), 1, torch.arange(3)) for f in forwards]).flatten()
    assert uniform.min() > 0 and uniform.max() < 1 and len(uniform.unique()) > 0.99 * len(uniform)
    probs = torch.tensor([[[0.5, 0.0, 0.2, 0.3]]]).expand(len(uniform), 1, 4)
    counts = torch.bincount(draw(probs, uniform[:, None]).flatten(), minlength=4) / len(uniform)
    assert counts[1] == 0 and torch.allclose(counts, probs[0, 0], atol=0.02)


@pytest.mark.parametrize(
    "field, value", [("temperature", -1.0), ("top_p", 0.0), ("top_k", -2), ("min_p", 1.5), ("frequency_penalty", 3)]
)
def test_out_of_range_sampling_is_refused_naming_the_field(field, value):
    with pytest.raises(ValueError, match=f"`{field}`"):
        SamplingParams(**{field: value})


@pytest.mark.parametrize("mode", MODES, ids=["plain", "lossless", "lossless+lookup"])
def test_dense_and_compact_slot_scoring_draw_the_same_tokens(model, mode, monkeypatch):
    """A device whose host reads stall scores every slot densely; the CPU scores the chosen slots only. Draws are
    keyed on the slot, so both give the same tokens."""
    config = server_config(model, **mode)
    compact = decode(model, config, SAMPLED)
    monkeypatch.setattr(fill, "HOST_READS_ARE_FREE", ())
    assert decode(model, config, SAMPLED) == compact


@pytest.mark.parametrize("mode", MODES[:2], ids=["plain", "lossless"])
def test_logit_bias_is_each_requests_own(model, mode):
    """A request's logit bias equals its lone `generate(sequence_bias=...)`; the request beside it, without one,
    its lone greedy run."""
    config = server_config(model, **mode)
    plain, _ = lone_generate(model, PROMPTS[0], BUDGET, config, do_sample=False)
    favoured = (plain[0] + 1) % 40  # the tiny model's vocabulary starts with ordinary tokens
    biased = SamplingParams(logit_bias=((favoured, 9.0), (plain[0], -50.0)))
    results = decode(model, config, [biased, SamplingParams()])
    tokens, _ = lone_generate(
        model, PROMPTS[0], BUDGET, config, do_sample=False, sequence_bias={(favoured,): 9.0, (plain[0],): -50.0}
    )
    assert results[0] == tokens != plain and results[1] == lone_generate(model, PROMPTS[1], BUDGET, config)[0]
    with pytest.raises(ValueError, match="`logit_bias`"):
        SamplingParams(logit_bias=((3, 101.0),))


@pytest.mark.parametrize("context, output", [(True, False), (False, True), (True, True)])
def test_seen_tokens_are_counted_by_hand_and_only_the_kinds_asked_for(context, output):
    """`SeenTokens.before` against counting by hand: at position j a row has seen its tokens from `first_real`
    (output: from the prompt's end) to `committed`, and the drafts before j; a kind not asked for is not built."""
    sequences = torch.tensor([[0, 4, 5, 4, 6, 5, 0], [3, 3, 4, 7, 7, 0, 0]])
    prompt_length, committed, first_real, drafts = 3, [6, 5], [1, 0], torch.tensor([[5, 2], [7, 7]])
    seen = SeenTokens.before(
        sequences, 8, prompt_length, torch.tensor(committed), torch.tensor(first_real), drafts,
        context=context, output=output,
    )
    for counts, wanted, from_prompt_end in ((seen.context, context, False), (seen.output, output, True)):
        if not wanted:
            assert counts is None
            continue
        expected = torch.zeros(2, 3, 8)
        for row in range(2):
            start = max(first_real[row], prompt_length) if from_prompt_end else first_real[row]
            for position in range(3):
                for token in sequences[row, start : committed[row]].tolist() + drafts[row, :position].tolist():
                    expected[row, position, token] += 1
        torch.testing.assert_close(counts, expected)
        kept = seen.of_rows(torch.tensor([1]))
        torch.testing.assert_close(kept.context if not from_prompt_end else kept.output, expected[1:])
