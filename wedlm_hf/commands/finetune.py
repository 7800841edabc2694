"""`wedlm-hf finetune MODEL --data FILE --output-dir DIR`: adapt a model to WeDLM decoding on `Trainer`.

Multi-process runs are `Trainer`'s: `torchrun --nproc_per_node 2 -m wedlm_hf.cli finetune ...` or
`accelerate launch -m wedlm_hf.cli finetune ...`; `--deepspeed ds.json` / `--fsdp full_shard` pass through.
"""

import argparse
from pathlib import Path

from ..evaluation.default_decoding import DefaultDecoding
from ..evaluation.report import GREEDY
from ..finetune.card import MIN_EVALUATED_STEPS
from ..finetune.recipe import FinetuneOptions
from ..loading.names import MODEL_HELP
from .options import add_field_arguments, add_written_arguments, field_values
from .placement import add_threads_argument

HELP = {  # one flag per `FinetuneOptions` field named here; the written options' flags come from the options table
    "seq_len": "tokens per training row (text is packed; each chat is one row)",
    "block_size": "prediction-stream block size B (the authors': 32)",
    "ar_weight": "weight of the auxiliary next-token loss on the clean stream (default 1.0; a draft-only adapter has none)",
    "suffix_prob": "share of blocks whose masks are the block's last tokens (as decoding meets them)",
    "lora_r": "LoRA rank of a draft-only adapter (acts at mask slots only: lossless output is the base model's); 0 = full fine-tuning",
    "lora_alpha": "LoRA alpha (default: 2 x rank)",
    "whole_model": "with --lora-r: an adapter on every token instead (changes the model's output; can be merged)",
    "merge": "with --lora-r --whole-model: write the merged model instead of the adapter",
    "mask_token": "an existing token to use as the mask (default: the model's, else a new one; LoRA: an unused special token)",
    "learning_rate": "peak learning rate, cosine decay (default: 2e-4 with LoRA, 2e-5 full)",
    "batch_size": "rows per device per step",
    "gradient_accumulation_steps": "steps whose gradients add up before each update",
    "max_steps": "optimizer steps (the cosine schedule's length)",
    "minutes": "stop after this many minutes (saving first), even before --max-steps",
    "warmup_steps": "linear warm-up: steps, or below 1 a share of --max-steps (0.1: 10 of 100 steps); one as long as the run is shortened to --max-steps - 1, with a warning, so the learning rate reaches its peak",
    "eval_share": "share of the rows held out for the eval loss",
    "eval_steps": "steps between eval-loss evaluations",
    "save_steps": "steps between checkpoints (resumable with --resume)",
    "logging_steps": "steps between log lines (loss, mdm and ar parts, learning rate)",
    "bf16": "bf16 mixed precision (CPU autocast where the CPU has bf16 units, e.g. AMX)",
    "gradient_checkpointing": "recompute activations in the backward pass: less memory, slower",
    "resume": "continue from the newest checkpoint in --output-dir",
    "seed": "seed of the data split, masking and initialisation",
    "eval_repeats": "timed repeats per decoding in the end-of-run evaluation (speeds are their median; 1 runs half the decodes of 3)",
    "eval_prompts": "JSONL of held-out prompts for the end-of-run evaluation (default: the data's held-out rows)",
    "chat_prompts": "JSONL of general chat prompts: report the greedy drift from the base model on them",
}


def register(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add("model", help="a WeDLM checkpoint or any model `wedlm_hf.enable` admits: " + MODEL_HELP)
    add("--data", required=True, help="JSONL of {'text': ...} or {'messages': [...]} records, or a local `datasets` file/folder")
    add(
        "--output-dir", required=True,
        help="where checkpoints and the adapted model (or adapter) are written (new or empty, unless --overwrite or --resume)",
    )
    add(
        "--overwrite", action="store_true",
        help="write into an --output-dir that already holds files: those of the run's names are replaced, others kept",
    )
    add_field_arguments(parser, FinetuneOptions, HELP)
    add_written_arguments(parser, "the output's generation config")
    add("--deepspeed", help="a DeepSpeed config file, as for any Trainer job")
    add("--fsdp", help="FSDP options, as TrainingArguments' `fsdp` (e.g. 'full_shard auto_wrap')")
    add_threads_argument(parser)
    evaluate = parser.add_mutually_exclusive_group()
    evaluate.add_argument(
        "--evaluate", action="store_const", const=True, default=None,
        help=f"run the end-of-run decoding evaluation, also after fewer than {MIN_EVALUATED_STEPS} steps (default: only "
        f"after {MIN_EVALUATED_STEPS} or more: a shorter run is a trial, whose model has barely moved, and the "
        "evaluation's minutes do not shrink with the run)",
    )
    evaluate.add_argument(
        "--no-evaluate", dest="evaluate", action="store_const", const=False,
        help="skip the end-of-run decoding evaluation (the default decoding written is then lossless)",
    )
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from ..finetune.recipe import finetune

    target = Path(args.output_dir)
    if target.is_dir() and any(target.iterdir()) and not (args.overwrite or args.resume):
        raise ValueError(
            f"{target} is not empty: pass --overwrite to write the run into it, --resume to continue its newest "
            "checkpoint, or name a new folder"
        )
    values = field_values(args, FinetuneOptions, exclude=("trainer_arguments",))
    passed = {name: getattr(args, name) for name in ("deepspeed", "fsdp") if getattr(args, name)}
    summary = finetune(args.model, args.data, args.output_dir, FinetuneOptions(**values, trainer_arguments=passed))
    if "written" in summary:  # the main process wrote the output; the others have nothing to add
        print("\n".join(summary_lines(summary, args.output_dir)))
    return 0


WRITTEN = {"draft-only adapter": "a draft-only adapter", "adapter": "an adapter", "model": "the model"}


def summary_lines(summary: dict, output_dir: str) -> list[str]:
    """A few lines: the run, where it wrote what (only files it wrote), and per evaluated domain lossless and plain
    WeDLM's tokens per forward (the whole summary is in finetune_summary.json)."""
    before = (summary.get("eval_before") or {}).get("eval_loss")
    after = summary["eval"].get("eval_loss")
    losses = f"train loss {summary['train_loss']:.3f}"
    if before is not None and after is not None:
        losses += f", eval loss {before:.3f} -> {after:.3f}"
    lines = [
        f"{summary['steps']} steps, {summary['tokens_seen']} tokens, {summary['wall_seconds']} s: {losses}",
        f"wrote {WRITTEN[summary['written']]} to {output_dir}; details: "
        + ", ".join(str(Path(output_dir) / name) for name in summary["details"]),
        "default decoding: " + DefaultDecoding(**summary["default_decoding"]).sentence(),
    ]
    rows = (summary.get("evaluation") or {}).get("rows", [])
    for domain in dict.fromkeys(row["domain"] for row in rows):
        cells = [
            f"{row['decoding']} {row['tokens_per_forward']:.2f} tokens/forward, {row['identical']:.0%} identical"
            for row in rows
            if row["domain"] == domain and row["decoding"] != GREEDY
        ]
        lines.append(f"{domain}: " + "; ".join(cells))
    return lines
