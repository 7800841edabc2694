"""Issue 13's targets, each a ratio measured side by side in one run (arms interleaved per repeat, medians of
paired per-repeat ratios, so load drift hits both sides of a ratio alike):

| target | ratio printed | goal |
|---|---|---|
| W=16 step vs the bare loop of forwards of the same widths (embedded checkpoint, held-out code) | time ratio | <= 1.05 |
| W=1 step (one slot per step) vs transformers' greedy step | time ratio | <= 1.15 |
| ... split: W=1 vs greedy inside the model's forwards (two tokens fed vs one), and outside them | time ratios | - |
| host syncs per step, plain and lossless | count | <= 2 |
| lossless vs greedy tokens/s, embedded held-out code | speed ratio | >= 1.0 |
| lossless adaptive vs lossless full drafts ("today's"), counting | speed ratio | >= 1.0 |
| plain WeDLM speed-up vs greedy / tokens per forward, counting | efficiency | >= 0.65 |
| lossless vs greedy tokens/s, SmolLM2-135M (`--smollm2`; loads the GGUF, ~1 min) | speed ratio | >= 0.9 |

The bare loop replays the W=16 decode's own forwards (same input widths, same cache growth: each forward's
window cropped to what the decode committed) as plain transformers calls with a `DynamicCache`, so it times the
forwards alone. The W=1 split times the same decodes with hooks on the model's forward, so its two parts are
the forward's share (a W=1 forward feeds two tokens: the slot filled last step, whose K/V it writes, and the next
mask slot) and the rest of the step (the decoding loop, mask building and `generate()`'s own work). All decodes
are greedy with EOS disabled (exact lengths). Also printed: ms per WeDLM step of the bench's random model at
`--vocab`, for before/after comparisons of two versions of the decoder (run this script against each, e.g. one
from `git worktree add /tmp/old <commit>` first on PYTHONPATH).

`--never-slower` prints only issue 34's table instead: lossless vs greedy wall-clock speed on held-out code (where
drafts fail), each prompt alone and `--batch` prompts in one left-padded call, on the embedded checkpoint and,
with `--smollm2`, SmolLM2-135M base and the shipped `smollm2-wedlm` (goals: >= 1.0x embedded and `smollm2-wedlm`,
>= 0.97x SmolLM2 base); lossless tokens per forward on counting (goal: >= 9.5); how many of lossless mode's
forwards after the first are wider than greedy's, per 100 tokens of held-out code (the hardware-free count of its
tries); and what a failed try of the adaptive schedule costs each model in AR forwards, its model forwards alone
(the cost model, `generation/forward_cost.py`, prices it from the device type's declared scale). WeDLM decodes in inference mode, greedy `generate()` under `no_grad`, as each runs for
its users; `--inference-mode` runs both in inference mode (as `wedlm-hf bench` times its arms), leaving the cost of
the decoding alone.

    python scripts/step_cost.py [--repeats 5] [--new-tokens 64] [--smollm2] [--threads 1] [--never-slower]
        [--inference-mode]
"""

import argparse
import statistics
import time
from collections.abc import Callable

import torch
from transformers import DynamicCache, GenerationConfig

import wedlm_hf
from wedlm_hf.continuous.padding import left_padded
from wedlm_hf.bench import random_model
from wedlm_hf.bench.measure import ForwardCounter
from wedlm_hf.bench.models import load_model
from wedlm_hf.bench.prompts import code_prompts, counting_prompts
from wedlm_hf.bench.syncs import Patcher, SyncCounter

from gpu_window_cost import try_cost


def generate(model, prompt: torch.Tensor, new_tokens: int, attention_mask: torch.Tensor | None = None, **options):
    return model.generate(
        prompt, attention_mask=torch.ones_like(prompt) if attention_mask is None else attention_mask,
        max_new_tokens=new_tokens, do_sample=False, eos_token_id=None, return_dict_in_generate=True, **options,
    )


def bare_forwards(model, prompt: torch.Tensor, new_tokens: int, options: dict) -> Callable[[], None]:
    """A loop of plain forwards with the widths and cache growth of one WeDLM decode of `prompt`."""
    calls = []
    hook = model.register_forward_hook(
        lambda m, a, k, out: calls.append((k["input_ids"].shape[1], k["logits_to_keep"])), with_kwargs=True
    )
    stats = generate(model, prompt, new_tokens, decoding="wedlm", **options).wedlm_stats
    hook.remove()
    # forward i (1-based) fed the tokens committed with commit step i: their K/V are what it keeps
    commits = [stats.commit_steps[0].count(step) for step in range(1, stats.model_calls + 1)]
    vocab = model.config.vocab_size

    def run() -> None:
        cache, past = DynamicCache(), 0
        for (width, logits_to_keep), kept in zip(calls, commits):
            ids = torch.randint(3, vocab - 1, (1, width))
            model(input_ids=ids, position_ids=torch.arange(past, past + width)[None], cache=cache, use_cache=True,
                  logits_to_keep=logits_to_keep)
            kept += prompt.shape[1] if past == 0 else 0
            cache.crop(kept - width)
            past += kept

    return run


def forward_split(model, first: Callable, second: Callable, repeats: int) -> tuple[float, float]:
    """Medians over interleaved repeats of first/second time spent inside the model's forwards, and outside."""
    inside, outside = [], []
    with ForwardCounter(model) as clock:
        for repeat in range(repeats + 1):  # repeat 0 warms up
            times = {}
            for name, run in sorted({"first": first, "second": second}.items(), reverse=bool(repeat % 2)):
                clock.seconds = 0.0
                total = timed(run)
                times[name] = (clock.seconds, total - clock.seconds)
            if repeat:
                inside.append(times["first"][0] / times["second"][0])
                outside.append(times["first"][1] / times["second"][1])
    return statistics.median(inside), statistics.median(outside)


def timed(run: Callable[[], object]) -> float:
    start = time.perf_counter()
    run()
    return time.perf_counter() - start


def paired(pairs: dict[str, tuple[Callable, Callable]], repeats: int) -> dict[str, float]:
    """Median over repeats of time(first) / time(second) per pair; every pair runs once per repeat, both sides
    back to back in an order that alternates."""
    ratios = {name: [] for name in pairs}
    for repeat in range(repeats + 1):  # repeat 0 warms up
        for name, (first, second) in pairs.items():
            a, b = (timed(first), timed(second)) if repeat % 2 else tuple(reversed((timed(second), timed(first))))
            if repeat:
                ratios[name].append(a / b)
    return {name: statistics.median(values) for name, values in ratios.items()}


def syncs_per_step(model, prompt: torch.Tensor, new_tokens: int, **options) -> float:
    counter, patcher = SyncCounter(), Patcher()
    with counter.patched(patcher):
        try:
            stats = generate(model, prompt, new_tokens, decoding="wedlm", **options).wedlm_stats
        finally:
            patcher.undo()
    return counter.count / stats.model_calls


def decodes(model, prompts: list[torch.Tensor], new_tokens: int, **options) -> Callable[[], None]:
    return lambda: [generate(model, p, new_tokens, **options) for p in prompts]


def load_smollm2():
    model, tokenizer = load_model("smollm2")  # not WeDLM-trained: the bench gives it a stand-in mask token
    mask_token_id = model.generation_config.mask_token_id
    model.generation_config = GenerationConfig(pad_token_id=tokenizer.eos_token_id, mask_token_id=mask_token_id)
    return model, tokenizer


def wider_forwards(model, prompts: list[torch.Tensor], new_tokens: int, **options) -> float:
    """Per 100 generated tokens, the forwards after each decode's first that feed more than one column (greedy feeds
    one): the hardware-free count of what tries cost where drafts fail."""
    widths = []
    hook = model.register_forward_pre_hook(
        lambda m, a, k: widths.append(k["input_ids"].shape[1]), with_kwargs=True
    )
    try:
        wider = 0
        for prompt in prompts:
            widths.clear()
            generate(model, prompt, new_tokens, **options)
            wider += sum(width > 1 for width in widths[1:])
    finally:
        hook.remove()
    return 100 * wider / (new_tokens * len(prompts))


def never_slower(args: argparse.Namespace) -> None:
    """Issue 34: lossless vs greedy wall-clock where drafts fail (held-out code), each prompt alone and `--batch`
    prompts left-padded in one call, on the embedded checkpoint and (`--smollm2`) SmolLM2-135M base and the shipped
    `smollm2-wedlm`; what a failed try costs each; and lossless tokens per forward on counting, where drafts pass."""
    n, lossless = args.new_tokens, {"decoding": "wedlm", "wedlm_lossless": True}
    models = {"embedded checkpoint": load_model(wedlm_hf.DEFAULT_MODEL)}
    if args.smollm2:
        models["SmolLM2-135M base"] = load_smollm2()
        models["smollm2-wedlm"] = load_model("smollm2-wedlm")
    pairs = {}
    for name, (model, tokenizer) in models.items():
        ids = [tokenizer(text)["input_ids"] for text in code_prompts(max(args.batch, args.prompts))]
        alone = [torch.tensor([prompt]) for prompt in ids[: args.prompts]]
        batch, mask = left_padded(ids[: args.batch], model.generation_config.pad_token_id)
        pairs[f"{name}, held-out code, batch 1"] = (
            decodes(model, alone, n, decoding="ar"), decodes(model, alone, n, **lossless)
        )
        pairs[f"{name}, held-out code, batch {args.batch}"] = (
            lambda m=model, b=batch, a=mask: generate(m, b, n, a, decoding="ar"),
            lambda m=model, b=batch, a=mask: generate(m, b, n, a, **lossless),
        )
    ratios = paired(pairs, args.repeats)
    model, tokenizer = models["embedded checkpoint"]
    counting = [tokenizer(text, return_tensors="pt")["input_ids"] for text in counting_prompts(args.prompts)]
    per_forward = [generate(model, p, n, **lossless).wedlm_stats.tokens_per_forward[0] for p in counting]
    print(f"torch threads {torch.get_num_threads()}, {args.repeats} interleaved repeats (medians of paired ratios), "
          f"{n} new tokens, EOS off, inference mode {'for both' if args.inference_mode else 'for WeDLM only'}; "
          f"{wedlm_hf.__file__}")
    print("| lossless vs greedy `generate()` | wall-clock speed, lossless / greedy |\n|---|---|")
    for name, ratio in ratios.items():
        print(f"| {name} | {ratio:.3f}x |")
    print(f"| embedded checkpoint, counting: lossless tokens per forward | {statistics.mean(per_forward):.2f} |")
    with torch.inference_mode():
        for name, (model, tokenizer) in models.items():
            alone = [torch.tensor([tokenizer(text)["input_ids"]]) for text in code_prompts(args.prompts)]
            wider = wider_forwards(model, alone, n, **lossless)
            print(f"| {name}, held-out code: lossless forwards wider than greedy's after the first, per 100 tokens "
                  f"| {wider:.2f} |")
            cost = try_cost(model, context=200, warmup=2, repeats=4 * args.repeats)
            print(f"| {name}: a failed try's cost, in AR forwards (model forwards alone) | {cost:.2f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--prompts", type=int, default=3, help="prompts per set")
    parser.add_argument("--vocab", type=int, default=32768, help="vocabulary of the random model's ms/step line")
    parser.add_argument("--smollm2", action="store_true", help="add the SmolLM2 lossless arm")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (0: torch's choice)")
    parser.add_argument("--never-slower", action="store_true", help="only issue 34's lossless vs greedy table")
    parser.add_argument("--batch", type=int, default=4, help="rows of the batched arms of --never-slower")
    parser.add_argument("--inference-mode", action="store_true", help="every arm in inference mode")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.never_slower:
        with torch.inference_mode(args.inference_mode):
            never_slower(args)
        return
    n = args.new_tokens
    model, tokenizer = load_model(wedlm_hf.DEFAULT_MODEL)

    def encode(texts):
        return [tokenizer(t, return_tensors="pt")["input_ids"] for t in texts]

    code, counting = encode(code_prompts(args.prompts)), encode(counting_prompts(args.prompts))
    w16, w1 = {"wedlm_window_size": 16}, {"wedlm_window_size": 1, "wedlm_entropy_threshold": None}
    lossless, full = {"wedlm_lossless": True}, {"wedlm_lossless": True, "wedlm_draft_schedule": "full"}
    bare = [bare_forwards(model, p, n, w16) for p in code]
    pairs = {
        "W=16 step / bare forwards": (decodes(model, code, n, decoding="wedlm", **w16), lambda: [r() for r in bare]),
        "W=1 step / greedy step": (decodes(model, code, n, decoding="wedlm", **w1), decodes(model, code, n, decoding="ar")),
        "lossless speed / greedy, code": (decodes(model, code, n, decoding="ar"), decodes(model, code, n, decoding="wedlm", **lossless)),
        "lossless adaptive / full, counting": (
            decodes(model, counting, n, decoding="wedlm", **full), decodes(model, counting, n, decoding="wedlm", **lossless)
        ),
        "plain speed-up / greedy, counting": (decodes(model, counting, n, decoding="ar"), decodes(model, counting, n, decoding="wedlm")),
    }
    smol = None
    if args.smollm2:
        smol, smol_tokenizer = load_smollm2()
        smol_prompts = [smol_tokenizer(t, return_tensors="pt")["input_ids"] for t in code_prompts(args.prompts)]
        pairs["lossless speed / greedy, SmolLM2"] = (
            decodes(smol, smol_prompts, n, decoding="ar"), decodes(smol, smol_prompts, n, decoding="wedlm", **lossless)
        )
    ratios = paired(pairs, args.repeats)
    w1_inside, w1_outside = forward_split(model, *pairs["W=1 step / greedy step"], args.repeats)
    counting_tpf = statistics.mean(
        generate(model, p, n, decoding="wedlm").wedlm_stats.tokens_per_forward[0] for p in counting
    )
    lossless_tpf = statistics.mean(generate(model, p, n, decoding="wedlm", **lossless).wedlm_stats.tokens_per_forward[0] for p in code)

    rows = [
        ("W=16 step / bare loop of same-width forwards (code)", f"{ratios['W=16 step / bare forwards']:.3f}x", "<= 1.05x"),
        ("W=1 step / greedy step (code)", f"{ratios['W=1 step / greedy step']:.3f}x", "<= 1.15x"),
        ("  split: inside the model's forwards, W=1 / greedy", f"{w1_inside:.3f}x", "-"),
        ("  split: outside them (loop, masks, generate()), W=1 / greedy", f"{w1_outside:.3f}x", "-"),
        ("host syncs per step, plain W=16", f"{syncs_per_step(model, code[0], n, **w16):.2f}", "<= 2"),
        ("host syncs per step, lossless", f"{syncs_per_step(model, code[0], n, **lossless):.2f}", "<= 2"),
        (
            f"lossless tokens/s / greedy (code, {lossless_tpf:.2f} tokens/forward)",
            f"{ratios['lossless speed / greedy, code']:.3f}x", ">= 1.0x",
        ),
        ("lossless adaptive / full drafts tokens/s (counting)", f"{ratios['lossless adaptive / full, counting']:.3f}x", ">= 1.0x"),
        (
            f"plain speed-up / tokens per forward (counting: {ratios['plain speed-up / greedy, counting']:.2f}x"
            f" at {counting_tpf:.2f})",
            f"{ratios['plain speed-up / greedy, counting'] / counting_tpf:.3f}", ">= 0.65",
        ),
    ]
    if smol is not None:
        rows.append(("lossless tokens/s / greedy (SmolLM2-135M, code)", f"{ratios['lossless speed / greedy, SmolLM2']:.3f}x", ">= 0.9x"))

    random = random_model(vocab_size=args.vocab, peak=60.0)
    random.generation_config = GenerationConfig(eos_token_id=None, pad_token_id=0)
    prompt = torch.randint(5, args.vocab - 5, (1, 32))
    seconds = [timed(lambda: generate(random, prompt, 128, decoding="wedlm")) for _ in range(3)]
    steps = generate(random, prompt, 128, decoding="wedlm").wedlm_stats.model_calls
    print(f"torch threads {torch.get_num_threads()}, {args.repeats} interleaved repeats, {n} new tokens, "
          f"{len(code)} prompts per set; {wedlm_hf.__file__}")
    print("| target | measured | goal |\n|---|---|---|")
    for row in rows:
        print("| " + " | ".join(row) + " |")
    print(f"\nrandom 4-layer d=256 model, vocab {args.vocab}: {1000 * statistics.median(seconds) / steps:.2f} ms/step, "
          f"{steps} steps (same step count across versions = same tokens)")


if __name__ == "__main__":
    main()
