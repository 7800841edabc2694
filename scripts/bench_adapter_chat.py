"""The shipped adapter on chat: lossless WeDLM's default draft schedule against the full one and against greedy.

Loads `smollm2-wedlm` (SmolLM2-135M-Instruct with its draft-only LoRA adapter) and, for the greedy baseline, SmolLM2
on its own: plain transformers `generate(do_sample=False)`, so the baseline pays nothing for the adapter's layers.
Two sets of chat prompts (the model's chat template): answers that turn predictable (number lists, the alphabet, a
times table) and open-ended ones whose drafts fail. Per prompt, at batch 1: one untimed pass of each arm (warm-up,
outputs and forward counts), then `--rounds` rounds of greedy, lossless WeDLM at the default schedule and at
`wedlm_draft_schedule="full"`, each once per round in an order rotated per round. Every lossless output must equal
greedy's token for token (else it stops with an error). Prints tokens per forward (default, full, default/full) and
each schedule's wall-clock speed against greedy (median of the per-round ratios), per prompt and as the median of
each set, then the bounds the default schedule is held to: on predictable chats default/full >= 0.8 and default
>= 1.3x greedy; on chats whose drafts fail default >= 0.95x greedy.

`--forward-scale` prices both schedules' widths and tries as `wedlm_forward_scale` does: "auto" (the default: the
profile stored for this machine and model, else the declared scale), "declared", or "measure" (the profile stored,
else measured first and stored: `generation/cost_profile.py`).

    python scripts/bench_adapter_chat.py [--max-new-tokens 160] [--rounds 3] [--threads 1] [--prompts-per-set N]
        [--forward-scale auto]
"""

import argparse
import datetime
import statistics
import time
from dataclasses import replace

import torch
from transformers import PreTrainedModel
from transformers.utils import logging

from wedlm_hf.bench.arms import FAMILIES, Arm
from wedlm_hf.bench.measure import machine_info
from wedlm_hf.bench.models import load_model
from wedlm_hf.generation.cost_profile import CHOICES, chosen_cost
from wedlm_hf.loading import load_model_and_tokenizer

ADAPTED = "smollm2-wedlm"
BASE = "smollm2"
"""The adapter's base (its adapter_config.json's `base_model_name_or_path`), loaded alone for the greedy baseline."""

PROMPT_SETS: dict[str, tuple[str, ...]] = {
    "turns predictable": (
        "List the numbers from 100 to 160, separated by commas.",
        "Count down from 90 to 40, separated by commas.",
        "Write the alphabet in upper case, letters separated by spaces.",
        "Write the multiplication table of 7 from 7 x 1 to 7 x 20, one line each.",
        "List the even numbers from 2 to 60, separated by commas.",
        "Count from 1 to 50 in words, one per line.",
    ),
    "drafts fail": (
        "Write a short story about a lighthouse keeper.",
        "Explain why the sky is blue.",
        "Give three tips for someone learning to cook.",
        "Describe a walk through a forest in autumn.",
        "What makes a good friend?",
        "Write a Python function that reverses a string.",
    ),
}
"""User turns per set; the three chats of docs/benchmarks.md's single-decode figures are among them (the list from
100 to 160, the count in words, the string-reversing function)."""

LOSSLESS = FAMILIES["wedlm_lossless"]
ARMS = {
    "default": Arm("default", "wedlm_lossless", LOSSLESS),
    "full": Arm("full", "wedlm_lossless", LOSSLESS | {"wedlm_draft_schedule": "full"}),
}
"""Lossless WeDLM at the adapter's default draft schedule and with every window slot drafted."""

BOUNDS = {
    "turns predictable": {"default/full": 0.8, "default vs greedy": 1.3},
    "drafts fail": {"default vs greedy": 0.95},
}
"""What each set's medians must reach for the default schedule to be the right default."""


@torch.inference_mode()
def greedy(base: PreTrainedModel, prompt: list[int], max_new_tokens: int) -> list[int]:
    """SmolLM2's own greedy continuation: transformers' `generate`, nothing of this package's."""
    input_ids = torch.tensor([prompt])
    sequences = base.generate(
        input_ids, attention_mask=torch.ones_like(input_ids), max_new_tokens=max_new_tokens, do_sample=False
    )
    return sequences[0, len(prompt) :].tolist()


def chat_prompt(tokenizer, content: str) -> list[int]:
    turn = [{"role": "user", "content": content}]
    text = tokenizer.apply_chat_template(turn, tokenize=False, add_generation_prompt=True)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def check_identical(name: str, tokens: list[int], expected: list[int]) -> None:
    if tokens != expected:
        raise AssertionError(
            f"lossless WeDLM ({name} schedule) differs from greedy\n  greedy: {expected}\n  {name}: {tokens}"
        )


def priced_arms(forward_scale: str) -> dict[str, Arm]:
    """`ARMS` pricing their widths with `wedlm_forward_scale=forward_scale`."""
    return {
        name: replace(arm, options=arm.options | {"wedlm_forward_scale": forward_scale}) for name, arm in ARMS.items()
    }


def bench_prompt(adapted: PreTrainedModel, base: PreTrainedModel, prompt: list[int], args) -> dict:
    """Tokens per forward of each schedule, their median speed ratios to greedy, and greedy's answer."""
    decoders = {"greedy": lambda: greedy(base, prompt, args.max_new_tokens)} | {
        name: (lambda arm=arm: arm.decode(adapted, prompt, args.max_new_tokens, exact_length=False))
        for name, arm in priced_arms(args.forward_scale).items()
    }
    first = {name: decode() for name, decode in decoders.items()}  # warm-up, outputs and forward counts
    expected = first["greedy"]
    for name in ARMS:
        check_identical(name, first[name].tokens, expected)
    seconds = {name: [] for name in decoders}
    names = list(decoders)
    for round_index in range(args.rounds):
        shift = round_index % len(names)
        for name in names[shift:] + names[:shift]:
            start = time.perf_counter()
            decoded = decoders[name]()
            seconds[name].append(time.perf_counter() - start)
            if name in ARMS:
                check_identical(name, decoded.tokens, expected)
    per_forward = {name: first[name].stats["generated"] / first[name].stats["forwards"] for name in ARMS}
    return {
        "tokens": len(expected),
        "default tok/fwd": per_forward["default"],
        "full tok/fwd": per_forward["full"],
        "default/full": per_forward["default"] / per_forward["full"],
        **{
            f"{name} vs greedy": statistics.median(g / s for g, s in zip(seconds["greedy"], seconds[name]))
            for name in ARMS
        },
        "answer": expected,
    }


COLUMNS = ("tokens", "default tok/fwd", "full tok/fwd", "default/full", "default vs greedy", "full vs greedy")


def row(label: str, values: dict) -> str:
    cells = [f"{values[c]:.0f}" if c == "tokens" else f"{values[c]:.2f}{'x' if 'vs' in c else ''}" for c in COLUMNS]
    return f"| {label} | " + " | ".join(cells) + " |"


def positive(value: str) -> int:
    number = int(value)
    if number < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {number}")
    return number


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-new-tokens", type=positive, default=160)
    parser.add_argument("--rounds", type=positive, default=3, help="timed rounds per prompt (medians over them)")
    parser.add_argument("--threads", type=positive, default=1, help="torch threads")
    parser.add_argument("--prompts-per-set", type=positive, default=None, help="only the first N prompts of each set")
    parser.add_argument(
        "--forward-scale", choices=CHOICES, default="auto", help="wedlm_forward_scale of both schedules"
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    logging.disable_progress_bar()
    adapted, tokenizer = load_model(ADAPTED)
    base = load_model_and_tokenizer(BASE)[0]

    machine = machine_info()
    cost, source = chosen_cost(adapted, args.forward_scale)  # ("measure": measured and stored here, before any arm)
    print(f"{datetime.date.today().isoformat()}, {machine['cpu']} ({machine['logical_cores']} logical cores), "
          f"{args.threads} torch thread(s), load average {machine['load_average'][0]:.2f}; {ADAPTED} (lossless "
          f"WeDLM) vs {BASE} greedy generate(), batch 1, {args.max_new_tokens} new tokens max, chat template, "
          f"medians of {args.rounds} interleaved rounds; widths priced with scale {cost.scale:g}, premium "
          f"{cost.premium:g} ({source})")
    print("| prompt | " + " | ".join(COLUMNS) + " | greedy answer starts |\n|---|" + "---|" * (len(COLUMNS) + 1))
    verdicts = []
    for set_name, contents in PROMPT_SETS.items():
        results = []
        for content in contents[: args.prompts_per_set]:
            result = bench_prompt(adapted, base, chat_prompt(tokenizer, content), args)
            results.append(result)
            answer = tokenizer.decode(result["answer"], skip_special_tokens=True)[:40]
            answer = answer.replace("\n", " ").replace("|", "/")
            print(row(f"{set_name}: {content}", result) + f" {answer} |", flush=True)
        medians = {column: statistics.median(r[column] for r in results) for column in COLUMNS}
        print(row(f"**{set_name}: median of {len(results)}**", medians) + "  |", flush=True)
        verdicts += [
            f"{set_name}: {column} {medians[column]:.2f} >= {bound}: {'yes' if medians[column] >= bound else 'NO'}"
            for column, bound in BOUNDS[set_name].items()
        ]
    print("\nevery lossless output was identical to greedy's; bounds on the medians: " + "; ".join(verdicts))


if __name__ == "__main__":
    main()
