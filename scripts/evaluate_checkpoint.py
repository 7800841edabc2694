"""Evaluate a WeDLM checkpoint against its own AR greedy decoding, on held-out stdlib code and counting prompts.

For every prompt the AR greedy run and the WeDLM runs (one per threshold) are interleaved, so machine load hits
both arms alike. Reported per prompt set and threshold: tokens per forward, wall-clock tokens/s of both arms, the
share of WeDLM continuations identical to AR greedy, and the AR perplexity (under the model) of both continuations.

    python scripts/evaluate_checkpoint.py                       # embedded checkpoint, print the table
    python scripts/evaluate_checkpoint.py --docs docs/training.md   # also replace the table in the docs
"""

import argparse
import datetime
import math
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import wedlm_hf
from wedlm_hf.bench.measure import machine_info
from wedlm_hf.bench.prompts import stdlib_files

COUNTING_PROMPTS = (
    "1, 2, 3, 4, 5, ",
    "1 2 3 4 5 6 ",
    "1\n2\n3\n4\n5\n",
    "x = [0, 1, 2, 3, 4, ",
    "10, 20, 30, 40, ",
    "100, 101, 102, 103, ",
)
LONG_COUNTING_PROMPTS = (  # the same layouts with ten items of context
    "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, ",
    "1 2 3 4 5 6 7 8 9 10 ",
    "1\n2\n3\n4\n5\n6\n7\n8\n9\n10\n",
    "x = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, ",
    "10, 20, 30, 40, 50, 60, 70, 80, 90, 100, ",
    "100, 101, 102, 103, 104, 105, 106, 107, 108, 109, ",
)
TABLE_START, TABLE_END = "<!-- eval-table:start -->", "<!-- eval-table:end -->"


def code_prompts(count: int, lines_after_def: int = 2) -> list[str]:
    """The `def` line plus the next lines of up to `count` functions, taken round-robin over the held-out files."""
    per_file = []
    for path in stdlib_files("eval"):
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
        found = [
            "\n".join(lines[i : i + 1 + lines_after_def]) + "\n"
            for i, line in enumerate(lines)
            if re.match(r"\s*def \w+\(.*\):\s*$", line) and i + lines_after_def < len(lines)
        ]
        per_file.append(found)
    prompts = []
    for rank in range(max(map(len, per_file), default=0)):
        prompts += [found[rank] for found in per_file if rank < len(found)]
    return prompts[:count]


@dataclass
class Arm:
    """Totals of one decoding arm over a prompt set."""

    generated: int = 0
    forwards: int = 0
    seconds: float = 0.0
    identical: int = 0
    runs: int = 0
    nll: list[float] = field(default_factory=list)

    def add(self, tokens: torch.Tensor, forwards: int, seconds: float, nll: float, identical: bool) -> None:
        self.generated += len(tokens)
        self.forwards += forwards
        self.seconds += seconds
        self.identical += identical
        self.runs += 1
        self.nll.append(nll)

    @property
    def perplexity(self) -> float:
        return math.exp(sum(self.nll) / len(self.nll))


def continuation_nll(model, prompt: torch.Tensor, continuation: torch.Tensor) -> float:
    """Mean next-token negative log-likelihood of `continuation` after `prompt`, under plain causal attention."""
    ids = torch.cat([prompt, continuation])[None]
    log_probs = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].log_softmax(-1)
    return -log_probs.gather(1, continuation[:, None]).mean().item()


def new_tokens(sequence: torch.Tensor, prompt_length: int, eos_id: int) -> torch.Tensor:
    """Generated tokens up to and including the first EOS (padding after it dropped)."""
    tokens = sequence[prompt_length:]
    stops = (tokens == eos_id).nonzero()
    return tokens[: int(stops[0]) + 1] if len(stops) else tokens


def evaluate(
    model, tokenizer, prompts: list[str], thresholds: list[float], penalty: float, window: int, max_new_tokens: int
) -> dict:
    eos_id = tokenizer.eos_token_id
    ar, wedlm = Arm(), {t: Arm() for t in thresholds}
    for text in prompts:
        inputs = tokenizer(text, return_tensors="pt")
        prompt = inputs["input_ids"][0]
        start = time.perf_counter()
        reference = model.generate(**inputs, decoding="ar", max_new_tokens=max_new_tokens, do_sample=False)
        seconds = time.perf_counter() - start
        reference = new_tokens(reference[0], len(prompt), eos_id)
        ar.add(reference, len(reference), seconds, continuation_nll(model, prompt, reference), True)
        for threshold in thresholds:
            start = time.perf_counter()
            output = model.generate(
                **inputs,
                decoding="wedlm",
                wedlm_window_size=window,
                wedlm_entropy_threshold=threshold,
                wedlm_pos_penalty_factor=penalty,
                max_new_tokens=max_new_tokens,
                return_dict_in_generate=True,
            )
            seconds = time.perf_counter() - start
            tokens = new_tokens(output.sequences[0], len(prompt), eos_id)
            forwards = output.wedlm_stats.summary()["forwards"]
            same = torch.equal(tokens, reference)
            wedlm[threshold].add(tokens, forwards, seconds, continuation_nll(model, prompt, tokens), same)
    return {"ar": ar, "wedlm": wedlm}


def table(results: dict[str, dict], window: int, penalty: float, max_new_tokens: int) -> str:
    rows = [
        "| prompts | threshold | tokens/forward | WeDLM tok/s | AR tok/s | speed-up | identical to AR | "
        "PPL WeDLM | PPL AR |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, result in results.items():
        ar = result["ar"]
        for threshold, arm in result["wedlm"].items():
            wedlm_speed, ar_speed = arm.generated / arm.seconds, ar.generated / ar.seconds
            rows.append(
                f"| {name} ({arm.runs}) | {threshold} | {arm.generated / arm.forwards:.2f} | {wedlm_speed:.0f} | "
                f"{ar_speed:.0f} | {wedlm_speed / ar_speed:.2f}x | {arm.identical}/{arm.runs} | "
                f"{arm.perplexity:.2f} | {ar.perplexity:.2f} |"
            )
    rows.append("")
    machine = machine_info()
    rows.append(
        f"`scripts/evaluate_checkpoint.py`, {datetime.date.today()}, {machine['logical_cores']}-vCPU "
        f"\"{machine['cpu']}\", torch threads {machine['torch_threads']}: window {window}, position penalty "
        f"{penalty}, greedy, one prompt per call, at most {max_new_tokens} new tokens."
    )
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=wedlm_hf.DEFAULT_MODEL)
    parser.add_argument("--thresholds", type=float, nargs="+", default=None, help="default: checkpoint's, 0.1")
    parser.add_argument("--penalty", type=float, default=None, help="default: the checkpoint's")
    parser.add_argument("--window", type=int, default=None, help="default: the checkpoint's")
    parser.add_argument("--code-prompts", type=int, default=24)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--docs", type=Path, default=None, help=f"markdown file whose {TABLE_START} block to replace")
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model).eval()
    config = model.generation_config
    thresholds = args.thresholds or [config.wedlm_entropy_threshold, 0.1]
    penalty = config.wedlm_pos_penalty_factor if args.penalty is None else args.penalty
    window = config.wedlm_window_size if args.window is None else args.window
    with torch.inference_mode():
        model.generate(**tokenizer("1, 2", return_tensors="pt"), max_new_tokens=8)  # warm-up
        prompt_sets = {
            "counting": list(COUNTING_PROMPTS),
            "counting, 10 items": list(LONG_COUNTING_PROMPTS),
            "held-out code": code_prompts(args.code_prompts),
        }
        results = {
            name: evaluate(model, tokenizer, prompts, thresholds, penalty, window, args.max_new_tokens)
            for name, prompts in prompt_sets.items()
        }
    markdown = table(results, window, penalty, args.max_new_tokens)
    print(markdown)
    if args.docs is not None:
        text = args.docs.read_text()
        pattern = re.compile(re.escape(TABLE_START) + ".*?" + re.escape(TABLE_END), re.S)
        if not pattern.search(text):
            raise SystemExit(f"{args.docs} has no {TABLE_START} ... {TABLE_END} block")
        args.docs.write_text(pattern.sub(lambda _: f"{TABLE_START}\n{markdown}\n{TABLE_END}", text))


if __name__ == "__main__":
    main()
