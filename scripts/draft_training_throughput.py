"""Training cost of a draft-only adapter against the whole-model LoRA recipe, side by side on one machine.

Both arms train a rank-r LoRA on every linear layer of the same base model, on the same rows, with the same
optimizer. `whole`: the earlier recipe (adapter on every token, the mask token's embedding row trained, the joint
2L forward with the AR loss, logits at every slot). `draft`: the draft-only adapter and its objective (memory stream
without autograd, masked slots alone through the head, no AR loss). Steps alternate between the arms, so load on
the machine falls on both alike. Printed: median seconds per step, training tokens per second, their ratio; with
`--minutes`, each arm also trains for the same wall-clock and the masked-slot loss of both is measured on the same
held-out batches.

    python scripts/draft_training_throughput.py --steps 8               # throughput only
    python scripts/draft_training_throughput.py --minutes 10            # plus loss after equal wall-clock
"""

import argparse
import copy
import statistics
import time

import torch
from transformers import AutoTokenizer

from wedlm_hf.finetune.data import pack_texts
from wedlm_hf.finetune.mask_token import ensure_mask_token
from wedlm_hf.finetune.adapters import with_draft_only_lora, with_lora
from wedlm_hf.loading import load_model_and_tokenizer
from wedlm_hf.training import DualStreamCollator
from wedlm_hf.training.corpus import low_entropy_documents, read_stdlib
from wedlm_hf.training.draft_objective import draft_only_forward
from wedlm_hf.training.objective import dual_stream_forward


def arms(model_name: str, rank: int) -> tuple[dict, AutoTokenizer, int]:
    base, tokenizer = load_model_and_tokenizer(model_name, dtype=torch.float32)
    mask_id, new_mask = ensure_mask_token(base, tokenizer, reuse=True)
    whole = with_lora(copy.deepcopy(base), rank, 2 * rank, mask_id if new_mask else None)
    draft = with_draft_only_lora(base, rank, 2 * rank, mask_id)
    built = {}
    for name, model, forward, ar_weight in (("whole", whole, dual_stream_forward, 1.0), ("draft", draft, draft_only_forward, 0.0)):
        model.train()
        trainable = [p for p in model.parameters() if p.requires_grad]
        built[name] = dict(model=model, forward=forward, ar_weight=ar_weight, seconds=[],
                           optimizer=torch.optim.AdamW(trainable, lr=5e-4))
    return built, tokenizer, mask_id


def step(arm: dict, batch: dict) -> float:
    started = time.perf_counter()
    loss, _, _ = arm["forward"](arm["model"], batch)
    loss.backward()
    arm["optimizer"].step()
    arm["optimizer"].zero_grad(set_to_none=True)
    seconds = time.perf_counter() - started
    arm["seconds"].append(seconds)
    return seconds


def masked_slot_loss(arm: dict, batches: list[dict]) -> float:
    """Mean loss on masked slots alone (the batches are made with AR weight 0, so each arm's training loss is it)."""
    arm["model"].eval()
    with torch.no_grad():
        losses = [arm["forward"](arm["model"], batch)[0].item() for batch in batches]
    arm["model"].train()
    return statistics.mean(losses)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--seq-len", type=int, default=192)
    parser.add_argument("--batch-size", type=int, default=6)
    parser.add_argument("--steps", type=int, default=8, help="timed steps per arm (after one warm-up step each)")
    parser.add_argument("--minutes", type=float, help="then train each arm this long and compare masked-slot loss")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    built, tokenizer, mask_id = arms(args.model, args.rank)
    texts = low_entropy_documents(200, 0) + read_stdlib("train", 400_000, 0)
    rows = pack_texts(texts, tokenizer, args.seq_len)
    held_out, rows = rows[:12], rows[12:]
    collators = {name: DualStreamCollator(mask_id, block_size=16, ar_weight=arm["ar_weight"], seed=1) for name, arm in built.items()}
    generator = torch.Generator().manual_seed(0)

    def batch_for(name: str) -> dict:
        picks = torch.randint(len(rows), (args.batch_size,), generator=generator).tolist()
        return collators[name]([rows[i] for i in picks])

    for name, arm in built.items():
        step(arm, batch_for(name))  # warm-up
        arm["seconds"].clear()
    for round_ in range(args.steps):
        for name in (("whole", "draft") if round_ % 2 == 0 else ("draft", "whole")):
            step(built[name], batch_for(name))
    tokens = args.batch_size * args.seq_len
    median = {name: statistics.median(arm["seconds"]) for name, arm in built.items()}
    print(f"threads {args.threads}, rows {args.batch_size} x {args.seq_len} tokens, LoRA rank {args.rank}, {args.steps} steps each")
    for name in built:
        print(f"  {name:5s}: median {median[name]:.2f} s/step, {tokens / median[name]:.0f} training tokens/s")
    print(f"  draft-only / whole-model tokens per second: {median['whole'] / median['draft']:.2f}x")
    if args.minutes:
        evaluation = DualStreamCollator(mask_id, block_size=16, ar_weight=0.0, seed=7)
        batches = [evaluation(held_out[i : i + 4]) for i in range(0, len(held_out), 4)]
        spent = {name: 0.0 for name in built}
        while min(spent.values()) < args.minutes * 60:
            name = min(spent, key=spent.get)  # the arm behind in wall-clock steps next
            spent[name] += step(built[name], batch_for(name))
        for name, arm in built.items():
            print(f"  {name:5s}: {len(arm['seconds'])} steps in {spent[name] / 60:.1f} min, "
                  f"masked-slot loss on held-out rows {masked_slot_loss(arm, batches):.3f}")


if __name__ == "__main__":
    main()
