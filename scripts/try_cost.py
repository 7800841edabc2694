"""What lossless WeDLM's wider forwards cost where drafts mostly fail: held-out code decoded by greedy `generate()`, by
lossless WeDLM, and by lossless WeDLM with no draft at all, interleaved in one process, every output checked
identical to greedy's.

Under `wedlm_forward_scale=1` no width pays, so that arm decodes one column per forward throughout: no first window,
no try (a forward of three columns, then one of four, in a run of one-column forwards; `generation/draft_schedule.py`),
no drafting. The lossless arm's difference from it is what its wider forwards cost net of the forwards they saved.
Prints, medians over rounds: each arm's decode time against greedy's, its forwards and wider forwards; then, from the
lossless decodes' own forwards, the one-column forwards far from a wider one and in the few after one, and the
forwards of three and four columns beside what the cost model prices a verifying step of that width at (the
decoder's own work in it included): where the wider forwards' time goes.

    python scripts/try_cost.py [--prompts 12] [--rounds 9] [--new-tokens 96] [--threads 1]
"""

import argparse
import statistics
import time
from collections import defaultdict

import torch
import transformers

import wedlm_hf
from wedlm_hf.bench.measure import ForwardCounter, machine_info
from wedlm_hf.bench.models import load_model
from wedlm_hf.bench.prompts import code_prompts
from wedlm_hf.generation.cost_profile import chosen_cost

ARMS = {
    "greedy generate()": None,
    "lossless": {"decoding": "wedlm", "wedlm_lossless": True},
    "lossless, no drafts": {"decoding": "wedlm", "wedlm_lossless": True, "wedlm_forward_scale": 1},
}
AFTER = 6
"""One-column forwards counted as "after a wider one" (the slower ones of a switch back)."""


def decode(model, inputs: dict, new_tokens: int, options: dict | None) -> tuple[torch.Tensor, float, ForwardCounter]:
    generate = transformers.GenerationMixin.generate if options is None else type(model).generate
    with torch.inference_mode(), ForwardCounter(model) as counter:
        start = time.perf_counter()
        sequences = generate(model, **inputs, max_new_tokens=new_tokens, do_sample=False, **(options or {}))
        return sequences, time.perf_counter() - start, counter


def forward_kinds(counter: ForwardCounter) -> dict[str, list[float]]:
    """Each forward after the first (the prompt's) by kind, in ms: one-column forwards by their distance from the
    last wider forward (the prompt's included), and the forwards of three and four columns."""
    kinds, since_wider = defaultdict(list), 0
    for width, _, seconds in counter.forwards[1:]:
        if width > 1:
            since_wider = 0
            if width in (3, 4):
                kinds[f"{width} columns"].append(1000 * seconds)
            continue
        since_wider += 1
        kind = f"one column, 1-{AFTER} after a wider one" if since_wider <= AFTER else "one column, further"
        kinds[kind].append(1000 * seconds)
    return kinds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=12)
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--new-tokens", type=int, default=96)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model, tokenizer = load_model(wedlm_hf.DEFAULT_MODEL)
    prompts = [tokenizer(prompt, return_tensors="pt") for prompt in code_prompts(args.prompts)]
    seconds, forwards, wider = defaultdict(list), defaultdict(list), defaultdict(list)
    kinds = defaultdict(list)
    for round_index in range(args.rounds + 1):  # the first: a warm-up
        totals = defaultdict(lambda: [0.0, 0, 0])
        for inputs in prompts:
            greedy = None
            for arm, options in ARMS.items():
                sequences, spent, counter = decode(model, inputs, args.new_tokens, options)
                if greedy is None:
                    greedy = sequences
                elif not torch.equal(sequences, greedy):
                    raise AssertionError(f"{arm} differs from greedy generate()")
                total = totals[arm]
                total[0] += spent
                total[1] += len(counter.forwards)
                total[2] += sum(width > 1 for width, _, _ in counter.forwards[1:])
                if arm == "lossless" and round_index:
                    for kind, ms in forward_kinds(counter).items():
                        kinds[kind] += ms
        for arm, (spent, count, wide) in totals.items():
            seconds[arm].append(spent)
            forwards[arm].append(count)
            wider[arm].append(wide)
    machine = machine_info()
    print(f"{machine['cpu']}, {args.threads} thread(s), load average {machine['load_average'][0]:.2f}; embedded "
          f"checkpoint, {args.prompts} held-out code prompts at batch 1, {args.new_tokens} new tokens, medians of "
          f"{args.rounds} rounds")
    print("| arm | ms | forwards | wider forwards (after the prompt's) |\n|---|---|---|---|")
    median = {arm: statistics.median(values[1:]) for arm, values in seconds.items()}
    for arm in ARMS:
        ratio = statistics.median(g / a for g, a in zip(seconds["greedy generate()"][1:], seconds[arm][1:]))
        print(f"| {arm} | {1000 * median[arm]:.1f} ({ratio:.3f}x greedy) | {forwards[arm][-1]} | {wider[arm][-1]} |")
    cost, source = chosen_cost(model, "auto")
    if not kinds["one column, further"]:
        raise SystemExit(f"no one-column forward came further than {AFTER} from a wider one: raise --new-tokens")
    further = statistics.median(kinds["one column, further"])
    print(f"\nthe lossless decodes' forwards, by kind (every round but the warm-up), against the one-column forwards "
          f"further than {AFTER} from a wider one; the cost model ({source}) prices verifying steps by their columns\n"
          "| kind | forwards | median ms | against further | priced |\n|---|---|---|---|---|")
    for kind in sorted(kinds):
        ms = statistics.median(kinds[kind])
        columns = int(kind[0]) if kind[0].isdigit() else None
        priced = f"{cost.step(columns, True) / cost.step(1):.2f}x" if columns else ""
        print(f"| {kind} | {len(kinds[kind])} | {ms:.3f} | {ms / further:.2f}x | {priced} |")


if __name__ == "__main__":
    main()
