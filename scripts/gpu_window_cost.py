"""What one W=16 WeDLM window forward costs relative to one single-token AR forward, on an 8B-shaped model.

WeDLM's wall-clock gain is tokens-per-forward divided by this ratio, so the ratio decides whether parallel
decoding pays off on a given GPU. Builds a randomly initialised Qwen3-8B-shaped model in bf16 directly on the
GPU (no download), prefills a 1k and a 4k context, then times with CUDA events (warm-up, median of repeats) a
one-token forward and a 16-token window forward (non-monotonic positions, explicit mask, as WeDLM feeds it)
against that cached context, cropping the cache back after each. Runs sdpa, and flash_attention_2 when the
`flash_attn` package imports. Written for an H200 (about 2 minutes); not run in the session that wrote it.

    python scripts/gpu_window_cost.py [--layers 36] [--contexts 1024,4096] [--window 16] [--repeats 30] [--json PATH]
    python scripts/gpu_window_cost.py --smoke   # CPU, tiny model: checks the script itself

`scripts/gpu_check.sh` runs this measurement among its others.
"""

import argparse
import importlib.util
import json
import statistics
import time
from pathlib import Path

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


def forward_cost(model, context: int, query: int, warmup: int, repeats: int, rows: int = 1) -> float:
    """Median ms of a forward of `query` new tokens per row of `rows` after a cached `context`, with WeDLM-style
    reversed positions."""
    device = model.device
    generator = torch.Generator(device="cpu").manual_seed(context)
    prompt = torch.randint(0, model.config.vocab_size - 1, (rows, context), generator=generator).to(device)
    cache = DynamicCache()
    model(input_ids=prompt, attention_mask=torch.ones_like(prompt), cache=cache, use_cache=True, logits_to_keep=1)
    tokens = torch.randint(0, model.config.vocab_size - 1, (rows, query), generator=generator).to(device)
    positions = context + torch.arange(query, device=device).flip(0)[None].expand(rows, -1)  # like a reordered window
    mask = torch.ones(rows, context + query, dtype=torch.long, device=device)
    extra = flash_sequence_lengths(model.config, rows, query, context, device)

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


def cost_table(model, context: int, batches, widths, warmup: int, repeats: int) -> list[dict]:
    """The forward-cost table of `wedlm_hf/generation/forward_cost.py` measured here: per batch size, a forward of
    each of `widths` tokens per row as a multiple of a one-token forward, after a cached `context`, and the scale
    its widest forward implies (`relative = (scale + rows * width) / (scale + rows)`)."""
    table = []
    for rows in batches:
        one = forward_cost(model, context, 1, warmup, repeats, rows)
        relative = [forward_cost(model, context, width, warmup, repeats, rows) / one for width in widths]
        implied = rows * (widths[-1] - relative[-1]) / max(relative[-1] - 1, 1e-6)
        table.append(dict(rows=rows, one_token_ms=one, widths=list(widths), relative=relative, implied_scale=implied))
    return table


def try_cost(model, context: int, warmup: int, repeats: int) -> float:
    """What a failed try of lossless mode's adaptive schedule costs in AR forwards (the forwards alone): its
    two forwards of three columns against two of one, after a cached `context`."""
    three, one = (forward_cost(model, context, width, warmup, repeats) for width in (3, 1))
    return 2 * (three / one - 1)


def build_model(smoke: bool, layers: int | None = None) -> Qwen3ForCausalLM:
    """A random Qwen3-8B-shaped model in bf16 on the GPU, or (`smoke`) a tiny fp32 one on the CPU."""
    device = torch.device("cpu" if smoke else "cuda")
    dtype = torch.float32 if smoke else torch.bfloat16
    shape = QWEN3_8B | (SMOKE if smoke else {})
    if layers is not None:
        shape["num_hidden_layers"] = layers
    torch.manual_seed(0)
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device), torch.inference_mode():
            model = Qwen3ForCausalLM(Qwen3Config(**shape)).eval()
    finally:
        torch.set_default_dtype(torch.float32)
    model.config._attn_implementation = "sdpa"
    return model


def describe(model: Qwen3ForCausalLM) -> str:
    name = torch.cuda.get_device_name() if model.device.type == "cuda" else "CPU (smoke test)"
    parameters = sum(p.numel() for p in model.parameters()) / 1e9
    layers = model.config.num_hidden_layers
    return f"{name}; Qwen3-8B shape, {layers} layers, {parameters:.2f}B parameters, {model.dtype}, batch 1"


def attention_implementations(model: Qwen3ForCausalLM) -> list[str]:
    """sdpa, plus flash_attention_2 on a GPU where the `flash_attn` package imports."""
    flash = model.device.type == "cuda" and importlib.util.find_spec("flash_attn") is not None
    return ["sdpa"] + (["flash_attention_2"] if flash else [])


def window_costs(model, contexts, window: int, warmup: int, repeats: int) -> list[dict]:
    """One row per attention implementation and context: AR 1-token and W-slot window forward ms, and their ratio."""
    rows = []
    with torch.inference_mode():
        for implementation in attention_implementations(model):
            model.config._attn_implementation = implementation
            for context in contexts:
                ar = forward_cost(model, context, 1, warmup, repeats)
                window_ms = forward_cost(model, context, window, warmup, repeats)
                rows.append(dict(attention=implementation, context=context, ar_ms=ar, window_ms=window_ms,
                                 window=window, ratio=window_ms / ar))
    model.config._attn_implementation = "sdpa"
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=QWEN3_8B["num_hidden_layers"])
    parser.add_argument("--contexts", default="1024,4096")
    parser.add_argument("--window", type=int, default=16)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--json", default=None, metavar="PATH", help="also write the rows as JSON")
    parser.add_argument("--smoke", action="store_true", help="tiny fp32 model on CPU, to test the script")
    args = parser.parse_args()
    if not args.smoke and not torch.cuda.is_available():
        raise SystemExit("needs a CUDA GPU (or --smoke for a CPU check of the script)")
    model = build_model(args.smoke, args.layers)
    print(describe(model))
    print(f"| attention | context | AR 1-token forward ms | W={args.window} window forward ms | window / AR |")
    print("|---|---|---|---|---|")
    rows = window_costs(model, [int(c) for c in args.contexts.split(",")], args.window, args.warmup, args.repeats)
    for r in rows:
        print(f"| {r['attention']} | {r['context']} | {r['ar_ms']:.2f} | {r['window_ms']:.2f} | {r['ratio']:.2f} |")
    if args.json:
        Path(args.json).write_text(json.dumps({"model": describe(model), "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
