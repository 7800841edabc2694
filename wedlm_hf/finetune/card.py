"""The end of a fine-tuning run: the before/after decoding evaluation, the default decoding it shows right, and the
model card beside the output.

Evaluation prompts default to the run's held-out rows (the first half of each text row; a chat's prompt turns), so
every run reports how much faster its own domain decodes, without a prompt file. Drift is measured when chat
prompts are given: the adapted model's greedy answers against the base model's. A trial run shorter than
`MIN_EVALUATED_STEPS` is not evaluated unless asked to be.
"""

import json
from pathlib import Path

import torch
from transformers import PreTrainedTokenizerBase
from transformers.utils import logging

from ..evaluation import EvalPrompt, EvaluationReport, evaluate_model, read_prompts
from ..evaluation.default_decoding import (
    DefaultDecoding,
    choose_default_decoding,
    decide_default_decoding,
    evaluated_thresholds,
    lossless,
)
from ..loading import load_model_and_tokenizer

logger = logging.get_logger(__name__)

HELD_OUT = "held-out"

SUMMARY, MODEL_CARD, EVALUATION_MARKDOWN, EVALUATION_JSON = (
    "finetune_summary.json", "README.md", "evaluation.md", "evaluation.json"
)
"""The files a run writes beside the model: always the first two, the evaluation's when it ran."""


def details(report: EvaluationReport | None) -> list[str]:
    """The files written beside the model: the summary and the model card, and the evaluation's if it ran."""
    return [SUMMARY, MODEL_CARD] + ([] if report is None else [EVALUATION_MARKDOWN, EVALUATION_JSON])

MIN_EVALUATED_STEPS = 50
"""Runs of fewer optimizer steps skip the end-of-run evaluation unless it is asked for: such a run (under half the
default `max_steps`, shorter than the default `eval_steps` interval) is a trial of the set-up, whose model has
barely left its starting point, while the evaluation costs the same whatever the run's length (every prompt through
six decodings, four passes each): it would measure the starting model, for longer than the run trained it."""


def should_evaluate(evaluate: bool | None, steps: int) -> bool:
    """`evaluate` as given; None: only after `MIN_EVALUATED_STEPS` steps, saying in one line when it is skipped."""
    if evaluate is not None:
        return evaluate
    if steps >= MIN_EVALUATED_STEPS:
        return True
    logger.warning(
        f"end-of-run evaluation skipped: {steps} steps is a trial run (fewer than {MIN_EVALUATED_STEPS}); "
        "--evaluate (FinetuneOptions(evaluate=True)) runs it anyway"
    )
    return False


def held_out_prompts(rows: list[dict], tokenizer: PreTrainedTokenizerBase, count: int = 8) -> list[EvalPrompt]:
    """Prompts from held-out rows: a text row's first half (its maskable tokens), a chat's tokens before its
    first assistant token; decoded back to text, so any tokenizer re-encodes them."""
    prompts = []
    for row in rows[:count]:
        ids, maskable = row["input_ids"], row["maskable"]
        chat = not maskable[0]
        cut = maskable.index(True) if chat else max(1, sum(maskable) // 2)
        prompts.append(EvalPrompt(text=tokenizer.decode(ids[:cut]), domain=f"{HELD_OUT} {'chat' if chat else 'text'}"))
    return prompts


def evaluate_output(
    output_dir: str,
    base_name: str,
    prompts: list[EvalPrompt],
    chat_prompts: str | None,
    threshold: float | None = None,
    max_new_tokens: int = 48,
    repeats: int = 3,
    progress: bool = True,
) -> EvaluationReport:
    """Evaluate the written output against its base, plain WeDLM at the user's `threshold` alone if given, with
    `repeats` timed repeats (and a progress bar); the report is written as evaluation.json / evaluation.md."""
    model, tokenizer = load_model_and_tokenizer(output_dir, dtype=torch.float32)
    extra = {}
    if chat_prompts:
        base, base_tokenizer = load_model_and_tokenizer(base_name, dtype=torch.float32)
        extra = dict(base_model=base, base_tokenizer=base_tokenizer, chat_prompts=read_prompts(chat_prompts))
    thresholds = evaluated_thresholds(threshold)
    with torch.inference_mode():
        report = evaluate_model(
            model, tokenizer, prompts, thresholds=thresholds, max_new_tokens=max_new_tokens, repeats=repeats,
            progress=progress, **extra,
        )
    report.write_json(Path(output_dir) / EVALUATION_JSON)
    (Path(output_dir) / EVALUATION_MARKDOWN).write_text(report.markdown())
    return report


def default_decoding(
    lossless_flag: bool | None, threshold: float | None, report: EvaluationReport | None, draft_only: bool
) -> DefaultDecoding:
    """The output's default decoding: always lossless for a draft-only adapter (plain would commit its drafts; with
    prompt lookup if its evaluation shows that faster),
    else the user's `--lossless` / `--plain` or what the evaluation shows right."""
    if draft_only and report is not None:
        return choose_default_decoding(report, plain_allowed=False)
    if draft_only:
        return lossless("a draft-only adapter: lossless WeDLM returns the base model's greedy output, its drafts only pay")
    return decide_default_decoding(lossless_flag, threshold, report)


CARD_KINDS = {
    "draft-only adapter": (
        "A draft-only LoRA adapter (PEFT)",
        "It acts at mask slots only, so lossless decoding (its default) returns exactly the base model's greedy "
        "output; the adapter only proposes drafts.",
    ),
    "adapter": ("A LoRA adapter (PEFT)", "It acts at every token, so the adapted model answers differently."),
    "model": ("A fine-tuned model", ""),
}


def write_model_card(output_dir: str, summary: dict, report: EvaluationReport | None) -> None:
    """README.md with Hub metadata: what the model is, how it was trained and loads, and its evaluation table."""
    options = summary["options"]
    kind = CARD_KINDS[summary["written"]]
    lines = [
        "---",
        f"base_model: {summary['base_model']}",
        "library_name: " + ("peft" if summary["written"].endswith("adapter") else "transformers"),
        "tags: [wedlm, parallel-decoding, wedlm-hf]",
        "---",
        "",
        f"# {Path(output_dir).name}",
        "",
        f"{kind[0]} of `{summary['base_model']}` for WeDLM parallel decoding, trained by `wedlm-hf finetune` "
        f"(dual-stream masked objective). {kind[1]}".rstrip(),
        "",
        "```python",
        "import wedlm_hf",
        "from wedlm_hf.loading import load_model_and_tokenizer",
        f'model, tokenizer = load_model_and_tokenizer("{output_dir}")',
        "wedlm_hf.enable(model)  # WeDLM is the default decoding of its generation config",
        "```",
        "",
        "## Training",
        "",
        f"- data: `{summary['data']}` ({summary['train_rows']} training rows, {summary['eval_rows']} held out)",
        f"- steps: {summary['steps']}, tokens seen: {summary['tokens_seen']}, wall time: {summary['wall_seconds']} s",
        f"- rows of {options['seq_len']} tokens, block {options['block_size']}, AR weight {summary['ar_weight']}, "
        f"LoRA rank {options['lora_r'] or 'none (full fine-tuning)'}, mask token id {summary['mask_token_id']}",
        f"- eval loss: {_loss(summary['eval_before'])} before, {_loss(summary['eval'])} after",
        "",
    ]
    decoding = DefaultDecoding(**summary["default_decoding"])
    lines += ["## Default decoding", "", decoding.sentence() + ".", ""]
    if report is not None:
        lines += ["## Evaluation", "", report.markdown()]
    (Path(output_dir) / MODEL_CARD).write_text("\n".join(lines))


def _loss(metrics: dict | None) -> str:
    return "-" if not metrics else f"{metrics['eval_loss']:.3f}"


def write_summary(output_dir: str, summary: dict) -> None:
    (Path(output_dir) / SUMMARY).write_text(json.dumps(summary, indent=2, default=str))
