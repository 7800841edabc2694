"""Per-step overhead of WeDLM decoding: how much of a step is the model forward, and what the rest costs.

Wraps (in this process only) the model's forward and the decoder's policies, backends, record, cache and window
functions with wall-clock timers, decodes a few prompts, and prints per step: the forward, each strategy function's own
time, and the unattributed remainder. Then a cProfile top list of the non-forward work. Run it at a small and a
realistic vocabulary: the strategy's tensor work scales with window x vocab, the forward with the model.

    python scripts/profile_step.py [--vocab 1024,32768,151936] [--batch 1] [--new-tokens 128] [--threads 1]
"""

import argparse
import cProfile
import functools
import inspect
import io
import pstats
import time
from collections import defaultdict

import torch

from wedlm_hf.bench import random_model
from wedlm_hf.bench.prompts import random_prompts
from wedlm_hf.generation import dynamic, fill, kv_pool, lossless, loop, plain, pool, record
from wedlm_hf.generation.cache import WeDLMCache

STRATEGY_CLASSES = (
    plain.PlainPolicy, lossless.LosslessPolicy, fill.SlotFiller, record.OutputRecord, dynamic.DynamicBackend,
    pool.PoolBackend, kv_pool.KVPool, WeDLMCache,
)
"""Every method these classes define is timed (found by introspection, so refactors need no edit here)."""
CALLING_MODULES = (loop, plain, lossless, fill, dynamic)
"""Modules whose functions from `wedlm_hf.generation` (their own and the ones they import) are timed, patched
where each module looks them up."""


class Timers:
    """Accumulated wall time per name; nested timers are subtracted from their parent ("self" time)."""

    def __init__(self):
        self.self_time = defaultdict(float)
        self.calls = defaultdict(int)
        self._stack = []

    def wrap(self, name, function):
        @functools.wraps(function)
        def timed(*args, **kwargs):
            self._stack.append(0.0)
            start = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                elapsed = time.perf_counter() - start
                children = self._stack.pop()
                self.self_time[name] += elapsed - children
                self.calls[name] += 1
                if self._stack:
                    self._stack[-1] += elapsed

        return timed


def timed_targets() -> list[tuple[object, str]]:
    methods = [
        (cls, name) for cls in STRATEGY_CLASSES for name, value in vars(cls).items()
        if callable(value) and name != "__init__" and not isinstance(value, (staticmethod, classmethod))
    ]
    return methods + [
        (module, name) for module in CALLING_MODULES for name, value in vars(module).items()
        if inspect.isfunction(value) and value.__module__.startswith("wedlm_hf.generation")
    ]


def instrument(model, timers: Timers) -> dict:
    """Wrap the strategy's methods/functions and the model forward; return the originals for `restore`."""
    originals = {target: getattr(*target) for target in timed_targets()}
    for (owner, name), original in originals.items():
        label = f"{owner.__name__.rsplit('.', 1)[-1]}.{name}"
        setattr(owner, name, timers.wrap(label, original))
    model.forward = timers.wrap("model forward", model.forward)
    return originals


def decode(model, prompts, new_tokens: int) -> int:
    """WeDLM decode of `prompts` as one batch; returns the number of model calls."""
    input_ids = torch.tensor(prompts)
    output = model.generate(
        input_ids, attention_mask=torch.ones_like(input_ids), max_new_tokens=new_tokens, decoding="wedlm",
        eos_token_id=None, return_dict_in_generate=True,
    )
    return output.wedlm_stats.model_calls


def profile(vocab: int, batch: int, new_tokens: int, repeats: int) -> None:
    model = random_model(vocab_size=vocab)
    prompts = random_prompts(batch, 32, vocab)
    with torch.inference_mode():
        decode(model, prompts, 16)  # warm-up, uninstrumented
        timers = Timers()
        originals = instrument(model, timers)
        steps = sum(decode(model, prompts, new_tokens) for _ in range(repeats))
        profiler = cProfile.Profile()
        profiler.enable()
        decode(model, prompts, new_tokens)
        profiler.disable()
    for (owner, name), original in originals.items():
        setattr(owner, name, original)
    del model.forward

    total = sum(timers.self_time.values())
    forward = timers.self_time["model forward"]
    print(
        f"\n## vocab {vocab}, batch {batch}, {new_tokens} new tokens: {steps} steps, {1000 * total / steps:.2f} ms/step, "
        f"forward {100 * forward / total:.0f}%, strategy {100 * (1 - forward / total):.0f}%"
    )
    print("| part | ms/step | share of step |\n|---|---|---|")
    for name, seconds in sorted(timers.self_time.items(), key=lambda item: -item[1]):
        print(f"| {name} | {1000 * seconds / steps:.3f} | {100 * seconds / total:.1f}% |")
    text = io.StringIO()
    stats = pstats.Stats(profiler, stream=text).sort_stats("tottime")
    stats.print_stats(r"generation|torch/functional|_tensor", 12)
    print("\ncProfile, top self time in the strategy's modules (one instrumented decode):")
    print("\n".join(line for line in text.getvalue().splitlines() if line.strip())[-2500:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocab", default="1024,32768,151936")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (0: torch's choice)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    for vocab in (int(v) for v in args.vocab.split(",")):
        profile(vocab, args.batch, args.new_tokens, args.repeats)


if __name__ == "__main__":
    main()
