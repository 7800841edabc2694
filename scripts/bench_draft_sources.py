"""Draft sources of lossless WeDLM side by side: mask-slot drafts alone, with prompt lookup, with the engine's
history of earlier requests (`draft_history`), and with both; against greedy AR and transformers' prompt lookup.

Every arm decodes every prompt of a set greedily, one request at a time; the WeDLM arms run on the engine (a
`WeDLMScheduler` per arm and repeat, kept for the whole set, so the history arms draft from the prompts of the
set answered before, and only those).
Reported per set and arm: tokens per forward (model forwards counted by a hook: hardware-free), wall-clock speed
relative to AR (medians of interleaved repeats: every arm in turn, so a busy moment of a shared machine falls on
all of them), and whether every output equals AR's (lossless: it must).

Sets: `code` (held-out stdlib functions), `counting`, `grounded` (edit a quoted function) and `repeated`: code
prompts each served once before with a small edit (a renamed function, other numbers): the originals go through
every arm first, untimed and uncounted, so the history arms have seen them, as a server would have.

    python scripts/bench_draft_sources.py                          # embedded checkpoint, every set
    python scripts/bench_draft_sources.py --model smollm2 --mask-token-id 16 --sets grounded repeated --num-prompts 6

(SmolLM2 has no mask token: 16, `<empty_output>`, is one it never predicts here, as in tests/test_real_model.py.)
"""

import argparse
import copy
import re
import statistics
import time

import torch

from wedlm_hf.bench.measure import ForwardCounter
from wedlm_hf.bench.models import load_model
from wedlm_hf.bench.prompts import code_prompts, counting_prompts, grounded_prompts
from wedlm_hf.continuous import GenerationRequest, WeDLMScheduler

ARMS = {
    "ar": {"decoding": "ar"},
    "transformers prompt lookup": {"decoding": "ar", "prompt_lookup_num_tokens": 10},
    "lossless (mask drafts)": {"wedlm_lossless": True},
    "lossless + lookup": {"wedlm_lossless": True, "wedlm_prompt_lookup": True},
    "lossless + history": {"wedlm_lossless": True, "draft_history": 1 << 15},
    "lossless + lookup + history": {"wedlm_lossless": True, "wedlm_prompt_lookup": True, "draft_history": 1 << 15},
}
SETS = ("code", "counting", "grounded", "repeated")


def edited(text: str, index: int) -> str:
    """A small edit of a prompt: its first function renamed and its numbers changed."""
    text = re.sub(r"def (\w+)", lambda match: f"def {match.group(1)}_v{index}", text, count=1)
    return re.sub(r"\b\d\b", lambda match: str((int(match.group(0)) + 3) % 10), text)


def prompt_texts(name: str, count: int, tokenizer) -> tuple[list[str], list[str]]:
    """(primed, measured): what the history arms have seen before, and the set's prompts."""
    if name == "repeated":
        originals = code_prompts(count)
        return originals, [edited(text, i) for i, text in enumerate(originals)]
    texts = {"code": code_prompts, "counting": counting_prompts}.get(name)
    return [], texts(count) if texts else grounded_prompts(count, tokenizer)


class Arm:
    """One decoding method; the WeDLM ones keep one scheduler (and its history) across prompts."""

    def __init__(self, name: str, model, options: dict):
        self.name, self.model, self.options = name, model, dict(options)
        self.scheduler = None
        if options.get("decoding") != "ar":
            config = copy.deepcopy(model.generation_config)
            for key, value in options.items():
                if key != "draft_history":
                    setattr(config, key, value)
            self.scheduler = WeDLMScheduler(
                model, config, max_batch_size=1, draft_history=options.get("draft_history")
            )

    def decode(self, ids: list[int], max_new_tokens: int) -> list[int]:
        if self.scheduler is None:
            output = self.model.generate(
                torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                max_new_tokens=max_new_tokens, do_sample=False, **self.options,
            )
            return output[0, len(ids) :].tolist()
        self.scheduler.add(GenerationRequest(ids, max_new_tokens))
        tokens = []
        while self.scheduler.has_work():
            for update in self.scheduler.step():
                tokens += update.new_tokens
        return tokens


def run_set(model, tokenizer, name: str, args) -> dict[str, dict]:
    primed, measured = prompt_texts(name, args.num_prompts, tokenizer)
    primed, measured = ([tokenizer(text)["input_ids"] for text in texts] for texts in (primed, measured))
    figures = {arm: {"seconds": [], "tokens": 0, "forwards": 0, "outputs": []} for arm in args.arms}
    for repeat in range(args.repeats):
        for name in args.arms:
            arm, figure = Arm(name, model, ARMS[name]), figures[name]  # a fresh history each repeat
            for ids in primed:
                arm.decode(ids, args.max_new_tokens)
            with ForwardCounter(model) as counter, torch.inference_mode():
                start = time.perf_counter()
                outputs = [arm.decode(ids, args.max_new_tokens) for ids in measured]
                figure["seconds"].append(time.perf_counter() - start)
            figure["tokens"], figure["forwards"], figure["outputs"] = sum(map(len, outputs)), counter.calls, outputs
    return figures


def table(results: dict[str, dict[str, dict]]) -> str:
    lines = [
        "| set | arm | tokens per forward | vs AR wall-clock | output = AR |",
        "|---|---|---|---|---|",
    ]
    for name, figures in results.items():
        ar = figures.get("ar")
        for arm, figure in figures.items():
            speed = figure["tokens"] / statistics.median(figure["seconds"])
            ratio = speed / (ar["tokens"] / statistics.median(ar["seconds"])) if ar else float("nan")
            same = "-" if ar is None else ("yes" if figure["outputs"] == ar["outputs"] else "NO")
            lines.append(
                f"| {name} | {arm} | {figure['tokens'] / max(figure['forwards'], 1):.2f} | {ratio:.2f}x | {same} |"
            )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None, help="a name or folder (default: the embedded checkpoint)")
    parser.add_argument("--sets", nargs="+", default=list(SETS), choices=SETS)
    parser.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    parser.add_argument("--num-prompts", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--mask-token-id", type=int, default=None, help="for a model whose config names none")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model, tokenizer = load_model(args.model)  # WeDLM decoding enabled (a plain transformers model, too)
    if args.mask_token_id is not None:
        model.generation_config.mask_token_id = args.mask_token_id
    results = {name: run_set(model, tokenizer, name, args) for name in args.sets}
    print(f"model: {args.model or 'embedded checkpoint'}; {args.num_prompts} prompts per set, {args.max_new_tokens} "
          f"new tokens, medians of {args.repeats} interleaved repeats, {args.threads} thread(s)")
    print(table(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
