"""What one W=16 WeDLM window forward costs relative to one single-token AR forward, on an 8B-shaped model.

WeDLM's wall-clock gain is tokens-per-forward divided by this ratio, so the ratio decides whether parallel
decoding pays off on a given GPU. Builds a randomly initialised Qwen3-8B-shaped model in bf16 directly on the
GPU (no download), prefills a 1k and a 4k context, then times with CUDA events (warm-up, median of repeats) a
one-token forward and a 16-token window forward (non-monotonic positions, explicit mask, as WeDLM feeds it)
against that cached context, cropping the cache back after each. Runs sdpa, and flash_attention_2 when the
`flash_attn` package imports. Written for an H200 (about 2 minutes); not run in the session that wrote it.

    python scripts/gpu_window_cost.py [--layers 36] [--contexts 1024,4096] [--window 16] [--repeats 30]
    python scripts/gpu_window_cost.py --smoke   # CPU, tiny model: checks the script itself
"""

import argparse
import importlib.util
import statistics
import time

import torch
from transformers import DynamicCache, Qwen3Config, Qwen3ForCausalLM

from wedlm_hf.generation.attention import flash_sequence_lengths

QWEN3_8B = dict(
    vocab_size=151936, hidden_size=4096, intermediate_size=12288, num_hidden_layers=36, num_attention_heads=32,
    num_key_value_heads=8, head_dim=128, max_position_embeddings=40960, rope_theta=1000000.0, rms_norm_eps=1e-6,
    tie_word_embeddings=False,
)
SMOKE = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2, head_dim=16)


def timed_ms(device: torch.device, function) -> float:
    """Milliseconds of `function()`: CUDA events on a GPU (kernel time, synchronised), perf_counter on CPU."""
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        function()
        end.record()
        end.synchronize()
        return start.elapsed_time(end)
    start = time.perf_counter()
    function()
    return 1000 * (time.perf_counter() - start)


def forward_cost(model, context: int, query: int, warmup: int, repeats: int) -> float:
    """Median ms of a forward of `query` new tokens after a cached `context`, with WeDLM-style reversed positions."""
    device = model.device
    generator = torch.Generator(device="cpu").manual_seed(context)
    prompt = torch.randint(0, model.config.vocab_size - 1, (1, context), generator=generator).to(device)
    cache = DynamicCache()
    model(input_ids=prompt, attention_mask=torch.ones_like(prompt), cache=cache, use_cache=True, logits_to_keep=1)
    tokens = torch.randint(0, model.config.vocab_size - 1, (1, query), generator=generator).to(device)
    positions = context + torch.arange(query, device=device).flip(0)[None]  # non-monotonic, like a reordered window
    mask = torch.ones(1, context + query, dtype=torch.long, device=device)
    extra = flash_sequence_lengths(model.config, 1, query, context, device)

    def step() -> None:
        model(input_ids=tokens, attention_mask=mask, position_ids=positions, cache=cache, use_cache=True,
              logits_to_keep=query, **extra)

    samples = []
    for i in range(warmup + repeats):
        elapsed = timed_ms(device, step)
        cache.crop(-query)  # transformers 5: a negative count of tokens to drop
        if i >= warmup:
            samples.append(elapsed)
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=QWEN3_8B["num_hidden_layers"])
    parser.add_argument("--contexts", default="1024,4096")
    parser.add_argument("--window", type=int, default=16)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--smoke", action="store_true", help="tiny fp32 model on CPU, to test the script")
    args = parser.parse_args()
    if not args.smoke and not torch.cuda.is_available():
        raise SystemExit("needs a CUDA GPU (or --smoke for a CPU check of the script)")
    device = torch.device("cpu" if args.smoke else "cuda")
    dtype = torch.float32 if args.smoke else torch.bfloat16
    shape = QWEN3_8B | (SMOKE if args.smoke else {}) | {"num_hidden_layers": args.layers}
    implementations = ["sdpa"] + (["flash_attention_2"] if importlib.util.find_spec("flash_attn") and not args.smoke else [])

    torch.manual_seed(0)
    torch.set_default_dtype(dtype)
    with torch.device(device), torch.inference_mode():
        model = Qwen3ForCausalLM(Qwen3Config(**shape)).eval()
    torch.set_default_dtype(torch.float32)
    name = torch.cuda.get_device_name() if device.type == "cuda" else "CPU (smoke test)"
    parameters = sum(p.numel() for p in model.parameters()) / 1e9
    print(f"{name}; Qwen3-8B shape, {args.layers} layers, {parameters:.2f}B parameters, {dtype}, batch 1")
    print(f"| attention | context | AR 1-token forward ms | W={args.window} window forward ms | window / AR |")
    print("|---|---|---|---|---|")
    with torch.inference_mode():
        for implementation in implementations:
            model.config._attn_implementation = implementation
            for context in (int(c) for c in args.contexts.split(",")):
                ar = forward_cost(model, context, 1, args.warmup, args.repeats)
                window = forward_cost(model, context, args.window, args.warmup, args.repeats)
                print(f"| {implementation} | {context} | {ar:.2f} | {window:.2f} | {window / ar:.2f} |", flush=True)


if __name__ == "__main__":
    main()
