"""Before/after evaluation of a model adapted for WeDLM: parallel decoding on its domains, drift on general chat.

Per domain, the prompts run through `wedlm_hf.bench`'s runner: greedy `generate()` (the reference), lossless WeDLM
with and without prompt lookup, and plain WeDLM at each threshold, one instrumented pass (outputs, forwards, lossless drafts) then interleaved timed
repeats, so speed-ups are paired medians on the same machine load. The drift check decodes general chat prompts
with the evaluated model in lossless WeDLM (exactly its greedy output, through the same window forwards its drafts
take) and greedily with a base model: fine-tuning for parallel decoding should not change what the model answers
elsewhere, and a draft-only adapter must change nothing at all.
"""

from collections.abc import Callable, Iterable

import torch
from tqdm.auto import tqdm
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from ..bench.arms import Arm
from ..bench.measure import machine_info
from ..bench.runner import BASELINE, ArmResult, BenchConfig, agreement, bench_prompt_set
from ..draft_adapter.enabling import enable
from .prompts import EvalPrompt, as_prompts
from .report import GREEDY, LOSSLESS, LOSSLESS_LOOKUP, DecodingRow, Drift, EvaluationReport, plain_name

DEFAULT_THRESHOLDS = (0.2, 0.4, 0.8)
"""Entropy thresholds of plain WeDLM: a strict, a middle and a loose one (the issue's 0.4 in the middle)."""


def decoding_arms(thresholds: Iterable[float]) -> list[Arm]:
    """Greedy (named as the bench baseline), lossless with and without prompt lookup (both exactly greedy), and
    plain WeDLM per threshold. Lossless and lookup are set explicitly either way, so a generation config that
    defaults to either cannot change another row."""
    arms = [
        Arm(BASELINE, "ar", {"decoding": "ar"}),
        Arm(LOSSLESS, "wedlm_lossless", {"decoding": "wedlm", "wedlm_lossless": True, "wedlm_prompt_lookup": False}),
        Arm(
            LOSSLESS_LOOKUP, "wedlm_lossless_lookup",
            {"decoding": "wedlm", "wedlm_lossless": True, "wedlm_prompt_lookup": True},
        ),
    ]
    for threshold in thresholds:
        options = {
            "decoding": "wedlm", "wedlm_lossless": False, "wedlm_prompt_lookup": False,
            "wedlm_entropy_threshold": float(threshold),
        }
        arms.append(Arm(plain_name(threshold), "wedlm", options, float(threshold)))
    return arms


def evaluate_model(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    prompts: Iterable[EvalPrompt | str],
    *,
    base_model: PreTrainedModel | None = None,
    base_tokenizer: PreTrainedTokenizerBase | None = None,
    chat_prompts: Iterable[EvalPrompt | str] | None = None,
    thresholds: Iterable[float] = DEFAULT_THRESHOLDS,
    max_new_tokens: int = 64,
    repeats: int = 3,
    progress: bool = False,
) -> EvaluationReport:
    """Measure WeDLM decoding of `model` on `prompts` (grouped by their domain) and, given `base_model` and
    `chat_prompts`, its greedy drift from the base model; see the module docstring and docs/evaluation.md.

    Token match is positionwise: for one prompt, the number of positions i where the continuation and the greedy
    one both hold token i and it is the same, divided by the longer continuation's length; rows report the mean
    over prompts. `identical` is the share of prompts whose continuation equals the greedy one exactly.
    `model` (and `base_model`) are WeDLM-enabled in place if they are not yet; `base_tokenizer` defaults to
    `tokenizer` and must encode the chat prompts to the same ids (token ids are what is compared). `progress` shows
    a bar of decodes on stderr: an evaluation takes minutes on a CPU.
    """
    if max_new_tokens < 1 or repeats < 1:
        raise ValueError(f"max_new_tokens ({max_new_tokens}) and repeats ({repeats}) must be at least 1")
    if (base_model is None) != (chat_prompts is None):
        raise ValueError("the drift check needs both `base_model` and `chat_prompts`: give both or neither")
    thresholds = tuple(thresholds)
    if not thresholds:
        raise ValueError("thresholds: give at least one entropy threshold for plain WeDLM, e.g. (0.2, 0.4, 0.8)")
    model = enable(model)
    arms = decoding_arms(thresholds)
    config = BenchConfig(max_new_tokens=max_new_tokens, repeats=repeats, thresholds=thresholds)
    domains = by_domain(as_prompts(prompts), tokenizer)
    chats = None if chat_prompts is None else as_prompts(chat_prompts)
    # bench_prompt_set's decodes: a warm-up per arm, then per prompt an instrumented pass and the timed repeats
    total = sum(len(arms) * (1 + len(ids) * (1 + repeats)) for ids in domains.values()) + 2 * len(chats or ())
    rows, drift = [], None
    with tqdm(total=total, desc="evaluate", unit="decode", disable=not progress) as bar:
        for domain, ids in domains.items():
            bar.set_description(f"evaluate {domain}")
            rows += [to_row(domain, len(ids), result) for result in bench_prompt_set(model, arms, ids, config, bar.update)]
        if base_model is not None:
            bar.set_description("evaluate chat drift")
            drift = greedy_drift(
                model, enable(base_model), tokenizer, base_tokenizer or tokenizer, chats, max_new_tokens, bar.update
            )
    settings = {"max_new_tokens": max_new_tokens, "repeats": repeats, "thresholds": list(thresholds)}
    return EvaluationReport(settings=settings, machine=machine_info(), rows=rows, drift=drift)


def by_domain(prompts: list[EvalPrompt], tokenizer: PreTrainedTokenizerBase) -> dict[str, list[list[int]]]:
    """Prompt ids per domain, domains in order of first appearance."""
    grouped: dict[str, list[list[int]]] = {}
    for prompt in prompts:
        grouped.setdefault(prompt.domain, []).append(prompt.token_ids(tokenizer))
    return grouped


def to_row(domain: str, count: int, result: ArmResult) -> DecodingRow:
    totals = result.wedlm_totals or {}
    return DecodingRow(
        domain=domain,
        decoding=GREEDY if result.arm == BASELINE else result.arm,
        prompts=count,
        generated=result.generated,
        forwards=result.forwards,
        tokens_per_forward=result.tokens_per_forward,
        identical=result.identical,
        token_match=result.token_match,
        tokens_per_s=result.tokens_per_s,
        speedup=result.speedup,
        drafted=totals.get("drafted"),
        accepted=totals.get("accepted"),
    )


def greedy_drift(
    model: PreTrainedModel,
    base_model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    base_tokenizer: PreTrainedTokenizerBase,
    chat_prompts: Iterable[EvalPrompt | str],
    max_new_tokens: int,
    tick: Callable[[int], object] = lambda decodes: None,
) -> Drift:
    """How many lossless continuations of `model` differ from `base_model`'s greedy ones, and their mean token
    match; `tick(2)` after each prompt's two decodes."""
    greedy, lossless, _ = decoding_arms(())
    ours, theirs, continuations = [], [], []
    for prompt in as_prompts(chat_prompts):
        ids = prompt.token_ids(tokenizer)
        if prompt.token_ids(base_tokenizer) != ids:
            raise ValueError(
                "the base model's tokenizer encodes a chat prompt differently: drift compares token ids, so give "
                "the base model's own tokenizer only if it tokenises like the evaluated model's"
            )
        with torch.inference_mode():
            ours.append(lossless.decode(model, ids, max_new_tokens, exact_length=False).tokens)
            theirs.append(greedy.decode(base_model, ids, max_new_tokens, exact_length=False).tokens)
        continuations.append(
            {
                "prompt": prompt.text if prompt.messages is None else list(prompt.messages),
                "model": tokenizer.decode(ours[-1], skip_special_tokens=True),
                "base": tokenizer.decode(theirs[-1], skip_special_tokens=True),
                "token_match": agreement([ours[-1]], [theirs[-1]])[1],
            }
        )
        tick(2)
    changed = sum(a != b for a, b in zip(ours, theirs))
    token_match = agreement(ours, theirs)[1]
    return Drift(prompts=len(ours), changed=changed, token_match=token_match, continuations=continuations)
