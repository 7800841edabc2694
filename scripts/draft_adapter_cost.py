"""What a draft-only adapter costs at decoding widths: adapted forward / base forward, interleaved, one run.

A WeDLM window forward over a cached prompt feeds `width` new tokens per row; with mask slots (all but the first
token, marked as the decoder marks them: `generation.mask_slots`) the adapter runs on those positions, without them
(an adaptive lossless AR step, or any forward of observed tokens) it must cost nothing. Random adapter weights: the
cost does not depend on what was learned.

    python scripts/draft_adapter_cost.py --threads 1 --targets q_proj k_proj v_proj o_proj gate_proj up_proj down_proj
"""

import argparse
import statistics
import time

import torch
from peft import get_peft_model

from wedlm_hf.finetune.mask_token import unused_special_token
from wedlm_hf.generation.mask_slots import forward_with_mask_slots
from wedlm_hf.draft_adapter import draft_only_lora_config, gate_draft_only_adapters, linear_module_names
from wedlm_hf.loading import load_model_and_tokenizer


def timed_forward(model, cache_of, ids: torch.Tensor, masks: int) -> float:
    cache = cache_of()
    slots = torch.ones(ids.shape[0], masks, dtype=torch.bool)
    started = time.perf_counter()
    forward_with_mask_slots(model, slots, input_ids=ids, cache=cache, use_cache=True, logits_to_keep=ids.shape[1])
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--targets", nargs="+", help="module names to adapt (default: every linear layer)")
    parser.add_argument("--prompt", type=int, default=64, help="cached prompt tokens per row")
    parser.add_argument("--widths", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    base, tokenizer = load_model_and_tokenizer(args.model, dtype=torch.float32)
    mask_id = tokenizer.convert_tokens_to_ids(unused_special_token(tokenizer))  # what `finetune --lora-r` picks
    targets = args.targets or linear_module_names(base)
    model = get_peft_model(base, draft_only_lora_config(args.rank, 2 * args.rank, targets, mask_id))
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "lora_B" in name:
                parameter.normal_(0, 0.01)
    gate_draft_only_adapters(model)
    inner = model.get_base_model().eval()
    print(f"{args.model}, LoRA rank {args.rank} on {', '.join(targets)}, {args.threads} thread(s), "
          f"{args.prompt}-token cached prompt, median of {args.repeats} interleaved forwards")
    print("batch | width | masks | base ms | adapted ms | adapted / base")
    generator = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        for batch in args.batches:
            prompt = torch.randint(100, 1000, (batch, args.prompt), generator=generator)
            with model.disable_adapter():
                prefix = inner(input_ids=prompt, use_cache=True).cache

            def cache_of():
                copied = type(prefix)(config=inner.config)
                for index, layer in enumerate(prefix.layers):
                    copied.update(layer.keys.clone(), layer.values.clone(), index)
                return copied

            for width in args.widths:
                for masks in sorted({0, width - 1}):
                    ids = torch.randint(100, 1000, (batch, width), generator=generator)
                    ids[:, width - masks :] = mask_id
                    times = {"base": [], "adapted": []}
                    for repeat in range(args.repeats + 1):
                        for arm in (("base", "adapted") if repeat % 2 else ("adapted", "base")):
                            if arm == "base":
                                with model.disable_adapter():
                                    seconds = timed_forward(inner, cache_of, ids, masks)
                            else:
                                seconds = timed_forward(inner, cache_of, ids, masks)
                            if repeat:  # the first round warms up
                                times[arm].append(seconds)
                    base_ms, adapted_ms = (1000 * statistics.median(times[arm]) for arm in ("base", "adapted"))
                    print(f"{batch:5d} | {width:5d} | {masks:5d} | {base_ms:7.2f} | {adapted_ms:10.2f} | {adapted_ms / base_ms:.2f}x")


if __name__ == "__main__":
    main()
