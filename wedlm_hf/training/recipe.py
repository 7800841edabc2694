"""Train the embedded WeDLM checkpoint from scratch on CPU (tokenizer, corpus, dual-stream objective).

At the end a short evaluation on held-out prompts chooses the checkpoint's default decoding, as `finetune` does.
"""

import csv
import json
import resource
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from ..bench.prompts import counting_prompts
from ..evaluation import EvalPrompt, EvaluationReport, evaluate_model
from ..evaluation.default_decoding import decide_default_decoding, evaluated_thresholds, write_default_decoding
from ..generation.options import BY_SETTING


@dataclass
class TrainOptions:
    """What `train` does; the defaults are the shipped checkpoint's run (docs/training.md)."""

    output_dir: str = "wedlm-tiny-code"
    steps: int = 8500
    batch_size: int = 8
    seq_len: int = 192
    block_size: int = 16
    lr: float = 3e-3
    warmup: int = 40
    ar_weight: float = 0.5
    low_entropy_share: float = 0.3
    code_chars: int = 12_000_000
    vocab_size: int = 2048
    hidden_size: int = 256
    layers: int = 4
    intermediate_size: int = 704
    eval_every: int = 100
    save_every: int = 500
    window_size: int = BY_SETTING["window_size"].default
    entropy_threshold: float | None = None
    """Plain WeDLM's threshold, the only one evaluated; None: the evaluation tries its default thresholds."""
    pos_penalty_factor: float = BY_SETTING["pos_penalty_factor"].default
    lossless: bool | None = None
    """The checkpoint's default decoding: True lossless, False plain; None: the one the evaluation shows right."""
    evaluate: bool = True
    seed: int = 0
    threads: int = 2


def build_model(tokenizer, args: TrainOptions):
    """A small Qwen3-layout WeDLM model (4 heads of 64, 2 KV heads, q/k norm, tied embeddings)."""
    from wedlm_hf import WeDLMConfig, WeDLMForCausalLM

    config = WeDLMConfig(
        vocab_size=len(tokenizer),
        hidden_size=args.hidden_size,
        intermediate_size=args.intermediate_size,
        num_hidden_layers=args.layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        max_position_embeddings=1024,
        tie_word_embeddings=True,
        qk_norm=True,
        mask_token_id=tokenizer.mask_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
    )
    config._attn_implementation = "sdpa"
    return WeDLMForCausalLM(config)


def train(args: TrainOptions) -> dict:
    """Train, save and evaluate the checkpoint in `args.output_dir`; returns the summary also written to
    training_log.json."""
    from tqdm.auto import tqdm
    from transformers import get_cosine_schedule_with_warmup, set_seed

    from .corpus import low_entropy_documents, pack, read_stdlib, training_rows
    from .objective import DualStreamCollator, dual_stream_forward
    from .tokenizer import train_tokenizer

    started = time.perf_counter()
    torch.set_num_threads(args.threads)
    set_seed(args.seed)
    output = Path(args.output_dir)
    output.mkdir(parents=True, exist_ok=True)

    code = read_stdlib("train", args.code_chars, args.seed)
    generated = low_entropy_documents(max(1, len(code)) * 4, args.seed)
    tokenizer = train_tokenizer(code + generated, args.vocab_size)
    code_rows = pack(code, tokenizer, args.seq_len)
    generated_rows = pack(generated, tokenizer, args.seq_len)
    eval_rows = pack(read_stdlib("eval", 400_000, args.seed), tokenizer, args.seq_len)[: args.batch_size]

    model = build_model(tokenizer, args)
    collator = DualStreamCollator(
        tokenizer.mask_token_id, block_size=args.block_size, ar_weight=args.ar_weight, seed=args.seed
    )
    eval_batch = DualStreamCollator(
        tokenizer.mask_token_id, block_size=args.block_size, ar_weight=args.ar_weight, seed=args.seed + 1
    )([{"input_ids": row} for row in eval_rows])
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01, betas=(0.9, 0.98))
    schedule = get_cosine_schedule_with_warmup(optimizer, args.warmup, args.steps)
    rows = training_rows(code_rows, generated_rows, args.steps * args.batch_size, args.low_entropy_share, args.seed)

    log: list[dict] = []
    progress = tqdm(range(1, args.steps + 1), desc="train", unit="step")
    for step in progress:
        batch = collator([{"input_ids": next(rows)} for _ in range(args.batch_size)])
        loss, parts, _ = dual_stream_forward(model, batch)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad(set_to_none=True)
        record = {"step": step, "split": "train", "loss": loss.item(), **parts, "lr": schedule.get_last_lr()[0]}
        log.append(record)
        if step % args.eval_every == 0 or step == args.steps:
            model.eval()
            with torch.no_grad():
                eval_loss, eval_parts, _ = dual_stream_forward(model, eval_batch)
            model.train()
            log.append({"step": step, "split": "eval", "loss": eval_loss.item(), **eval_parts, "lr": record["lr"]})
        progress.set_postfix(loss=f"{record['loss']:.3f}", mdm=f"{parts['mdm']:.3f}", ar=f"{parts['ar']:.3f}")
        if args.save_every and step % args.save_every == 0 and step < args.steps:
            save(output, model, tokenizer, args)
            write_logs(output, log, summarize(args, model, code_rows, generated_rows, started, step))

    save(output, model, tokenizer, args)
    summary = summarize(args, model, code_rows, generated_rows, started, args.steps)
    report = evaluate_checkpoint(model.eval(), tokenizer, eval_rows, args, output) if args.evaluate else None
    decoding = decide_default_decoding(args.lossless, args.entropy_threshold, report)
    write_default_decoding(output, decoding)
    summary["default_decoding"] = decoding.to_dict()
    write_logs(output, log, summary)
    return summary


def evaluate_checkpoint(
    model, tokenizer, eval_rows: torch.Tensor, args: TrainOptions, output: Path
) -> EvaluationReport:
    """Greedy, lossless and plain WeDLM on the first halves of four held-out code rows and on two counting prompts;
    short (one timed repeat, 32 new tokens): it only has to show which decoding reproduces greedy. Written as
    evaluation.json / evaluation.md beside the checkpoint."""
    half = eval_rows.shape[1] // 2
    prompts = [EvalPrompt(text=tokenizer.decode(row[:half]), domain="held-out code") for row in eval_rows[:4]]
    prompts += [EvalPrompt(text=text, domain="counting") for text in counting_prompts(2)]
    thresholds = evaluated_thresholds(args.entropy_threshold)
    with torch.inference_mode():
        report = evaluate_model(model, tokenizer, prompts, thresholds=thresholds, max_new_tokens=32, repeats=1)
    report.write_json(output / "evaluation.json")
    (output / "evaluation.md").write_text(report.markdown())
    return report


def summarize(args: TrainOptions, model, code_rows, generated_rows, started: float, step: int) -> dict:
    return {
        "arguments": asdict(args),
        "steps_done": step,
        "parameters": sum(p.numel() for p in model.parameters()),
        "train_rows_available": {"code": len(code_rows), "generated": len(generated_rows)},
        "wall_seconds": time.perf_counter() - started,
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def save(output: Path, model, tokenizer, args: TrainOptions) -> None:
    """Model, tokenizer and WeDLM generation defaults; intermediate saves overwrite each other. The default decoding
    is lossless (or the user's `--plain`) until the end-of-run evaluation chooses."""
    from transformers import GenerationConfig

    threshold = BY_SETTING["entropy_threshold"].default if args.entropy_threshold is None else args.entropy_threshold
    model.generation_config = GenerationConfig(
        decoding="wedlm",
        wedlm_window_size=args.window_size,
        wedlm_entropy_threshold=threshold,
        wedlm_pos_penalty_factor=args.pos_penalty_factor,
        wedlm_lossless=args.lossless is not False,
        mask_token_id=tokenizer.mask_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        do_sample=False,
    )
    model.save_pretrained(output)
    tokenizer.save_pretrained(output)


def write_logs(output: Path, log: list[dict], summary: dict) -> None:
    """training_log.json (summary + every record), loss_curves.csv and loss_curves.png beside the checkpoint."""
    (output / "training_log.json").write_text(json.dumps({**summary, "log": log}))
    with open(output / "loss_curves.csv", "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(log[0]))
        writer.writeheader()
        writer.writerows(log)
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot

    figure, axis = pyplot.subplots(figsize=(7, 4))
    for split, style in (("train", "-"), ("eval", "o-")):
        records = [r for r in log if r["split"] == split]
        for part in ("mdm", "ar"):
            steps = [r["step"] for r in records]
            values = [r[part] for r in records]
            if split == "train":
                values = smooth(values, 20)
            axis.plot(steps, values, style, label=f"{split} {part}", markersize=3)
    axis.set_xlabel("step")
    axis.set_ylabel("loss (nats / token)")
    axis.set_title("WeDLM dual-stream training: masked (mdm) and next-token (ar) loss")
    axis.legend()
    figure.tight_layout()
    figure.savefig(output / "loss_curves.png", dpi=100)
    pyplot.close(figure)


def smooth(values: list[float], window: int) -> list[float]:
    """Trailing moving average, so the noisy per-step curve is readable."""
    out, total = [], 0.0
    for index, value in enumerate(values):
        total += value
        if index >= window:
            total -= values[index - window]
        out.append(total / min(index + 1, window))
    return out
