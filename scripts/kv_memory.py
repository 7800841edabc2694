"""Peak K/V memory of continuous batching's block pool against what the live tokens need.

`--requests` requests of mixed lengths (prompts of 16 to `--longest` tokens, budgets of 16 to `--longest`, drawn
with a fixed seed; EOS suppressed, so each runs its whole budget) are queued at once and run through
`WeDLMScheduler` with as many rows, on the embedded checkpoint. At every forward (a model forward pre-hook): the
pool's K/V bytes (its storage: every block, held or free), the bytes of the blocks the rows hold, and the bytes
their live tokens need: each running row's committed K/V (`end`: prompt and kept tokens), and the same plus the
window the forward feeds. Prints the peak of each and their ratios. The pool's storage never shrinks, so its peak
is its size at the end; while it grows, one layer's keys or values are alive twice, and each forward gathers, one
layer at a time, each row's positions up to the longest row's for attention (both printed too).

    python scripts/kv_memory.py                              # 32 requests, prompts and budgets 16-512
    python scripts/kv_memory.py --requests 4 --longest 64    # a quick run
"""

import argparse
import copy
import random

import torch
from transformers import AutoModelForCausalLM

import wedlm_hf
from wedlm_hf.continuous import GenerationRequest, WeDLMScheduler
from wedlm_hf.generation.kv_pool import KVPool
from wedlm_hf.generation.transformers_version import CACHE_KEYWORD

SHORTEST = 16


def mixed_requests(count: int, longest: int, vocab: int, seed: int = 0) -> list[GenerationRequest]:
    rng = random.Random(seed)
    return [
        GenerationRequest(
            [rng.randrange(3, vocab) for _ in range(rng.randint(SHORTEST, longest))], rng.randint(SHORTEST, longest)
        )
        for _ in range(count)
    ]


class PoolWatch:
    """Per forward over the pool: (storage, held, live, live plus window) in tokens, and the largest tensor."""

    def __init__(self, scheduler: WeDLMScheduler):
        self.pool, self.samples, self.largest = scheduler.batch.pool, [], 0

    def __call__(self, module, args, kwargs) -> None:
        cache = kwargs.get(CACHE_KEYWORD)
        if not isinstance(cache, KVPool):
            return
        blocks, ends, fed = cache.blocks, self.pool.ends, kwargs["input_ids"].shape[1]
        held = sum(map(len, blocks.held)) * blocks.block_size
        read = len(ends) * (max(ends) + fed)
        self.samples.append((blocks.capacity * blocks.block_size, held, sum(ends), sum(ends) + fed * len(ends), read))
        self.largest = max(t.numel() * t.element_size() for layer in cache.layers for t in (layer.keys, layer.values))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=wedlm_hf.DEFAULT_MODEL)
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--longest", type=int, default=512, help="the longest prompt and the largest budget")
    parser.add_argument("--seed", type=int, default=0, help="draws the prompts and budgets")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    if args.longest < SHORTEST:
        parser.error(f"--longest must be at least {SHORTEST}")
    torch.set_num_threads(args.threads)
    model = wedlm_hf.enable(AutoModelForCausalLM.from_pretrained(args.model).eval())
    config = copy.deepcopy(model.generation_config)
    config.suppress_tokens = [config.eos_token_id] if isinstance(config.eos_token_id, int) else config.eos_token_id
    text = model.config.get_text_config()
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    per_token = 2 * text.num_hidden_layers * text.num_key_value_heads * head_dim * model.dtype.itemsize
    scheduler = WeDLMScheduler(model, config, max_batch_size=args.requests, kv_pool=True)
    requests = mixed_requests(args.requests, args.longest, text.vocab_size, args.seed)
    watch = PoolWatch(scheduler)
    model.register_forward_pre_hook(watch, with_kwargs=True)
    for request in requests:
        scheduler.add(request)
    ended = []
    while scheduler.has_work():
        ended += [update.result for update in scheduler.step() if update.finished]
    assert all(result.error is None for result in ended), [result.error for result in ended if result.error]
    storage, held, live, with_window, read = (max(column) for column in zip(*watch.samples))
    at_peak = max(watch.samples, key=lambda sample: sample[2])
    mb = per_token / 2**20
    print(f"{args.requests} requests, prompts {min(len(r.input_ids) for r in requests)}-"
          f"{max(len(r.input_ids) for r in requests)} tokens, budgets {min(r.max_new_tokens for r in requests)}-"
          f"{max(r.max_new_tokens for r in requests)}; {sum(len(r.tokens) for r in ended)} tokens generated in "
          f"{len(watch.samples)} forwards; K/V {per_token} B per token, blocks of "
          f"{scheduler.batch.pool.cache.blocks.block_size} positions")
    print("| peak of | MB | vs live tokens |\n|---|---|---|")
    for name, tokens in (
        ("live tokens (each running row's committed K/V)", live),
        ("live tokens plus the fed window", with_window),
        ("blocks the rows hold", held),
        ("pool K/V (every block, held or free)", storage),
    ):
        print(f"| {name} | {tokens * mb:.1f} | {tokens / live:.2f}x |")
    print(f"At the live peak the rows hold {at_peak[1] / at_peak[2]:.2f}x their live tokens. While the pool grows,"
          f" one more tensor of at most {watch.largest / 2**20:.1f} MB is alive. A forward's attention reads each"
          f" row's positions up to the longest row's: at most {read * mb / text.num_hidden_layers:.1f} MB gathered"
          f" per layer, freed after it.")


if __name__ == "__main__":
    main()
