"""Lossless sampling draws from the model's own sampled `generate()` distribution, proved by statistics.

The exact joint probabilities of the first generated tokens are enumerated from the model (one forward per
prefix, through the warpers transformers' sampling applies, in its order), and the empirical joint distribution
of (prompt, tokens) over many lossless samples (one batched call, two left-padded prompts in alternate rows) is
compared with them by Pearson's chi-square test.

Power: a bias that moves 2% of the probability mass (total variation 0.02, so sum |delta| = 0.04) has, with N
draws, a noncentrality N * sum(delta^2 / p) >= N * (sum |delta|)^2 = 0.0016 N (Cauchy-Schwarz, sum p = 1),
whatever the bias looks like. `_power` evaluates the test's power at that noncentrality (Wilson-Hilferty for the
critical value, a normal approximation of the noncentral chi-square) and each test asserts it is >= 0.99:
`DRAWS` = 48000 gives 0.99 up to about 34 degrees of freedom.
"""

import math

import pytest
import torch
from tiny_models import EOS_ID, MASK_ID, PAD_ID, random_prompts, tiny_model
from transformers import LogitsProcessorList
from transformers.generation import logits_process as lp

import wedlm_hf
from wedlm_hf.generation import decoding, fill, tree

DRAWS = 48000
"""Lossless samples per setting, half per prompt."""
ALPHA = 1e-3
"""The chance that a correct decoder fails one comparison (the draws are seeded, so a run is reproducible)."""
Z_ALPHA, Z_POWER = 3.090, 2.326
"""Standard normal quantiles for ALPHA and for power 0.99."""
SETTINGS = {
    "temperature+top_k": dict(temperature=0.7, top_k=2),
    "top_p": dict(top_p=0.7),
    "min_p+temperature": dict(min_p=0.3, temperature=1.3),
    "typical+epsilon": dict(typical_p=0.5, epsilon_cutoff=0.08),
    "eta+top_k": dict(eta_cutoff=0.02, top_k=3),
    "repetition_penalty+top_k": dict(repetition_penalty=3.0, top_k=3),
    "prompt_lookup+top_k": dict(top_k=2, wedlm_prompt_lookup=True, wedlm_prompt_lookup_ngram=1),
    "prompt_lookup+typical": dict(top_k=2, typical_p=0.9, wedlm_prompt_lookup=True, wedlm_prompt_lookup_ngram=1),
    "prompt_lookup_matches+top_k": dict(
        top_k=2, wedlm_prompt_lookup=True, wedlm_prompt_lookup_ngram=1, wedlm_prompt_lookup_matches=3
    ),
}
"""Warper settings; in the last three, prompt lookup's drafts (one-hot proposals) join the mask slots' after a
rejection, and the first prompt's own continuation is drafted in the first forward (with keyed draws, then with
torch's generator and the processors run per prefix, as typical sampling has no dense form; then with three
matches as branches)."""


def _model(family: str):
    """A tiny model whose head is a fixed logit vector plus a prefix-dependent part (std ~0.8): the distributions
    depend on the prefix, and mask-slot predictions (q) are near the AR ones (p), so drafts are often accepted.
    EOS, padding and the mask id are never drawn."""
    model = tiny_model(family, seed=11, peak=1.0)
    generator = torch.Generator().manual_seed(11)
    head = torch.nn.Linear(64, 96, bias=True)
    with torch.no_grad():
        head.weight.copy_(torch.randn(96, 64, generator=generator) * 0.1)
        head.bias.copy_(torch.randn(96, generator=generator) * 3.0)
        head.bias[[EOS_ID, PAD_ID, MASK_ID]] = -1e4
    model.lm_head = head
    return wedlm_hf.enable(model)


def _warpers(options: dict) -> LogitsProcessorList:
    """transformers' processors and sampling warpers for `options`, in the order `generate()` builds them."""
    warpers = LogitsProcessorList()
    if "repetition_penalty" in options:
        warpers.append(lp.RepetitionPenaltyLogitsProcessor(options["repetition_penalty"]))
    if options.get("temperature", 1.0) != 1.0:
        warpers.append(lp.TemperatureLogitsWarper(options["temperature"]))
    if "top_k" in options:
        warpers.append(lp.TopKLogitsWarper(options["top_k"]))
    if "top_p" in options:
        warpers.append(lp.TopPLogitsWarper(options["top_p"]))
    if "min_p" in options:
        warpers.append(lp.MinPLogitsWarper(options["min_p"]))
    if "typical_p" in options:
        warpers.append(lp.TypicalLogitsWarper(options["typical_p"]))
    if "epsilon_cutoff" in options:
        warpers.append(lp.EpsilonLogitsWarper(options["epsilon_cutoff"]))
    if "eta_cutoff" in options:
        warpers.append(lp.EtaLogitsWarper(options["eta_cutoff"], device="cpu"))
    return warpers


@torch.no_grad()
def _exact(model, prompt: torch.Tensor, warpers: LogitsProcessorList, depth: int) -> dict[tuple, float]:
    """The exact probability of every sequence of `depth` generated tokens after `prompt` (1D)."""
    sequences = {(): 1.0}
    for _ in range(depth):
        prefixes = list(sequences)
        input_ids = torch.stack([torch.cat([prompt, torch.tensor(prefix, dtype=torch.long)]) for prefix in prefixes])
        logits = model(input_ids).logits[:, -1].float()
        probs = torch.softmax(warpers(input_ids, logits), dim=-1)
        sequences = {
            (*prefix, token): sequences[prefix] * float(probs[row, token])
            for row, prefix in enumerate(prefixes)
            for token in probs[row].nonzero().flatten().tolist()
        }
    return sequences


def _chi_square(counts: dict[tuple, int], exact: dict[tuple, float], draws: int) -> tuple[float, int]:
    """Pearson's statistic and degrees of freedom of `counts` against `exact` probabilities (of `draws` draws in
    all, so they sum to 1 over the prompts); cells expecting fewer than 5 draws are pooled into one."""
    outside = set(counts) - set(exact)
    assert not outside, f"sequences of probability 0 drawn: {sorted(outside)[:3]}"
    pooled_expected = pooled_count = 0.0
    statistic, cells = 0.0, 0
    for cell, probability in exact.items():
        expected, count = probability * draws, counts.get(cell, 0)
        if expected < 5:
            pooled_expected, pooled_count = pooled_expected + expected, pooled_count + count
            continue
        statistic, cells = statistic + (count - expected) ** 2 / expected, cells + 1
    if pooled_expected > 0:
        statistic, cells = statistic + (pooled_count - pooled_expected) ** 2 / pooled_expected, cells + 1
    return statistic, cells - 2  # each prompt's draws are fixed (half of them)


def _critical(df: int) -> float:
    """The chi-square quantile at 1 - ALPHA (Wilson-Hilferty)."""
    return df * (1 - 2 / (9 * df) + Z_ALPHA * math.sqrt(2 / (9 * df))) ** 3


def _power(df: int, draws: int) -> float:
    """The power against any bias of 2% of the probability mass: noncentrality >= 0.0016 * draws."""
    noncentrality = 0.0016 * draws
    mean, sd = df + noncentrality, math.sqrt(2 * (df + 2 * noncentrality))
    return 0.5 * math.erfc((_critical(df) - mean) / sd / math.sqrt(2))


DENSE = ("top_p", "repetition_penalty+top_k")
"""Settings also checked with every slot scored densely (the row-wise path `generate()` takes for these)."""


@pytest.mark.parametrize(
    "setting, scoring",
    [(name, "compact") for name in SETTINGS] + [(name, "dense") for name in DENSE] + [("prompt_lookup+top_k", "chain")],
)
def test_lossless_sampling_has_the_models_distribution(setting, scoring, monkeypatch):
    """Drafts scored at the chosen slots (the CPU's way) or at every slot (an accelerator's: `fill.py`); prompt
    lookup's drafts as a branch beside the window's (`tree.py`, wherever it may) or, "chain", in the window."""
    if scoring == "dense":
        monkeypatch.setattr(fill, "HOST_READS_ARE_FREE", ())
    if scoring == "chain":
        monkeypatch.setattr(decoding, "trees_allowed", lambda *args: False)
    branches_taken, verified = [], tree.verified

    def counted(*args):
        result = verified(*args)
        branches_taken.extend(result[2][result[1]].tolist())
        return result

    monkeypatch.setattr(tree, "verified", counted)
    options = SETTINGS[setting]
    depth = 3 if options.get("top_k") == 2 else 2  # three tokens where two per step keep the cells few
    family = "llama" if setting == "top_p" else "wedlm"
    model = _model(family)
    prompts, attention = random_prompts([6, 3], seed=7)
    if options.get("wedlm_prompt_lookup"):  # prompts made of the likeliest tokens, so the context often matches
        likely = model.lm_head.bias.topk(3).indices
        prompts[0, :], prompts[1, 3:] = likely[[0, 1, 2, 0, 1, 2]], likely[[2, 1, 0]]
    input_ids, attention_mask = prompts.repeat(DRAWS // 2, 1), attention.repeat(DRAWS // 2, 1)
    torch.manual_seed(0)
    output = model.generate(
        input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=depth, do_sample=True, **options,
        decoding="wedlm", wedlm_lossless=True, mask_token_id=MASK_ID, wedlm_window_size=3,
        return_dict_in_generate=True,
        # llama, not WeDLM-trained, would start at zero drafts and try its first after 64 tokens: draft every slot;
        # a batch of DRAWS rows prices every draft out on a CPU: a scale at which drafts pay at any batch size
        **({"wedlm_draft_schedule": "full"} if family == "llama" else {"wedlm_forward_scale": 1e9}),
    )
    stats = output.wedlm_stats.summary()
    assert stats["accepted"] > 0.2 * stats["generated"] / depth, stats  # drafts are really verified and accepted
    assert stats["accepted"] < stats["drafted"], stats  # and some are rejected: both branches run
    if options.get("wedlm_prompt_lookup"):  # mask slots draft 2 per row (window 3), never after a rejection
        assert stats["drafted"] > 2 * DRAWS, stats
        first_step = [steps.count(steps[0]) for steps in output.wedlm_stats.commit_steps[::2]]  # the first prompt's
        assert sum(count > 1 for count in first_step) > 0.1 * len(first_step)  # drafts passed in the prefill
        as_branch = "typical" not in setting and scoring != "chain"  # (typical_p reads more than a row)
        assert (len(branches_taken) > 0.05 * DRAWS) == as_branch, len(branches_taken)
        taken = set(branches_taken)
        assert taken == (set(range(options.get("wedlm_prompt_lookup_matches", 2))) if as_branch else set()), taken
    generated = output.sequences[:, input_ids.shape[1] :].tolist()
    warpers, exact, counts = _warpers(options), {}, {}
    for row, (prompt, mask) in enumerate(zip(prompts, attention)):
        for sequence, probability in _exact(model, prompt[mask.bool()], warpers, depth).items():
            exact[(row, *sequence)] = probability / len(prompts)
    assert abs(sum(exact.values()) - 1) < 1e-4
    for row, sequence in enumerate(generated):
        cell = (row % len(prompts), *sequence)
        counts[cell] = counts.get(cell, 0) + 1
    statistic, df = _chi_square(counts, exact, len(generated))
    assert _power(df, len(generated)) >= 0.99, (df, _power(df, len(generated)))
    assert statistic < _critical(df), (setting, statistic, df, _critical(df))


def test_seeded_lossless_sampling_is_reproducible():
    model = _model("wedlm")
    input_ids, attention_mask = random_prompts([6, 3, 9], seed=7)
    runs = []
    for _ in range(2):
        torch.manual_seed(3)
        runs.append(
            model.generate(
                input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=16, do_sample=True,
                temperature=0.8, decoding="wedlm", wedlm_lossless=True, mask_token_id=MASK_ID,
            )
        )
    assert torch.equal(*runs)
