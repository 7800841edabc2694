"""Where one decode's time goes: every forward timed and sorted by kind, against greedy's, one chat at a time.

`bench_adapter_chat.py` prints a schedule's wall-clock against greedy; this says why. Per chat, after an untimed
warm-up of each, greedy `generate()` of the base model and lossless WeDLM of the adapted one decode once each,
their forwards timed by hooks (`bench.measure.ForwardCounter`) and split into: the prompt's forward, one-column
steps, and wider steps (a lossless step with drafts or a try, the first window with its mask slots, which is the
prompt's forward there); what is left of the decode's time is the decoder's own work around its forwards. Output must
be identical (checked).

    python scripts/forward_split.py [--adapted smollm2-wedlm] [--base smollm2] [--max-new-tokens 160]
        [--forward-scale auto] [--threads 1] "Write a short story about a lighthouse keeper." ...
"""

import argparse
import statistics
import time

import torch

from wedlm_hf.bench.measure import ForwardCounter, machine_info
from wedlm_hf.bench.models import load_model
from wedlm_hf.generation.cost_profile import CHOICES, chosen_cost
from wedlm_hf.loading import load_model_and_tokenizer


def timed_decode(model, input_ids: torch.Tensor, **options) -> tuple[list[int], float, ForwardCounter]:
    with torch.inference_mode(), ForwardCounter(model) as counter:
        start = time.perf_counter()
        sequences = model.generate(input_ids, attention_mask=torch.ones_like(input_ids), do_sample=False, **options)
        seconds = time.perf_counter() - start
    return sequences[0, input_ids.shape[1] :].tolist(), seconds, counter


def split(seconds: float, counter: ForwardCounter) -> dict[str, tuple[int, float, float]]:
    """(forwards, median ms, total ms) per kind of forward, and the time outside them."""
    kinds: dict[str, list[float]] = {"prompt": [], "one column": [], "wider": []}
    for index, (width, masked, spent) in enumerate(counter.forwards):
        kind = "prompt" if index == 0 else "one column" if width == 1 and not masked else "wider"
        kinds[kind].append(1000 * spent)
    rows = {kind: (len(ms), statistics.median(ms) if ms else 0.0, sum(ms)) for kind, ms in kinds.items()}
    rows["outside forwards"] = (0, 0.0, 1000 * (seconds - counter.seconds))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("chats", nargs="+", help="user turns, each decoded with the chat template")
    parser.add_argument("--adapted", default="smollm2-wedlm")
    parser.add_argument("--base", default="smollm2", help="the model greedy decodes (the adapter's base)")
    parser.add_argument("--max-new-tokens", type=int, default=160)
    parser.add_argument("--forward-scale", choices=CHOICES, default="auto", help="wedlm_forward_scale")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    adapted, tokenizer = load_model(args.adapted)
    base = load_model_and_tokenizer(args.base)[0]
    cost, source = chosen_cost(adapted, args.forward_scale)
    machine = machine_info()
    print(f"{machine['cpu']}, {args.threads} thread(s), load average {machine['load_average'][0]:.2f}; lossless "
          f"WeDLM priced with scale {cost.scale:g}, premium {cost.premium:g} ({source})")
    lossless = dict(decoding="wedlm", wedlm_lossless=True, wedlm_forward_scale=args.forward_scale)
    for chat in args.chats:
        text = tokenizer.apply_chat_template([{"role": "user", "content": chat}], tokenize=False,
                                             add_generation_prompt=True)
        input_ids = tokenizer(text, add_special_tokens=False, return_tensors="pt")["input_ids"]
        arms = {"greedy": (base, {}), "lossless": (adapted, lossless)}
        for model, options in arms.values():  # warm-up
            timed_decode(model, input_ids, max_new_tokens=args.max_new_tokens, **options)
        decoded = {
            name: timed_decode(model, input_ids, max_new_tokens=args.max_new_tokens, **options)
            for name, (model, options) in arms.items()
        }
        if decoded["greedy"][0] != decoded["lossless"][0]:
            raise AssertionError(f"lossless WeDLM differs from greedy on {chat!r}")
        print(f"\n{chat} ({len(decoded['greedy'][0])} tokens; greedy / lossless wall-clock "
              f"{decoded['greedy'][1] / decoded['lossless'][1]:.2f}x)")
        print("| kind | greedy forwards | median ms | total ms | lossless forwards | median ms | total ms |\n"
              "|---|---|---|---|---|---|---|")
        splits = {name: split(seconds, counter) for name, (_, seconds, counter) in decoded.items()}
        for kind in splits["greedy"]:
            cells = [f"{count} | {median:.1f} | {total:.0f}" for count, median, total in
                     (splits[name][kind] for name in arms)]
            print(f"| {kind} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
