"""Adapt a causal LM to WeDLM decoding on transformers' `Trainer`: the dual-stream objective, LoRA or full.

The recipe is the paper's (spec §6-7) at a user's scale: continued training on text, or SFT on chats with only
the response masked. With `lora_r` the adapter is draft-only by default (`wedlm_hf.draft_adapter`): it acts at mask
slots alone, the base model stays exactly itself, lossless decoding returns its greedy output, and training skips
what cannot learn (`training.draft_objective`). A whole-model adapter or full fine-tuning changes the model; the
auxiliary AR loss there keeps its next-token behaviour close (lossless decoding verifies against it). Everything multi-process or memory-saving is `Trainer`'s own: `accelerate launch` /
`torchrun` data parallelism, DeepSpeed and FSDP configs, gradient checkpointing, bf16, resuming.
"""

import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch
from transformers import GenerationConfig, PreTrainedTokenizerBase, TrainingArguments

from ..evaluation import read_prompts
from ..evaluation.default_decoding import write_default_decoding
from ..generation.options import BY_SETTING, FINETUNE, exposed_to
from ..generation.transformers_version import CHECKPOINTING_ARGUMENT
from ..loading import load_model_and_tokenizer
from ..draft_adapter import MERGE_REFUSED
from ..training.draft_objective import draft_only_forward
from ..training.objective import DualStreamCollator, WeDLMTrainer, dual_stream_forward
from .card import default_decoding, details, evaluate_output, held_out_prompts, should_evaluate, write_model_card
from .card import write_summary
from .data import RowDataset, build_rows, read_records
from .adapters import with_draft_only_lora, with_lora
from .mask_token import ensure_mask_token
from .schedule import TimeLimit, fit_warmup


@dataclass
class FinetuneOptions:
    """What a fine-tuning run does, with defaults chosen for adapting a pretrained model.

    `block_size` 32 and `ar_weight` 1.0 are the authors' (paper and public fine-tuning code; None picks 1.0, and
    0 for a draft-only adapter, whose AR loss would train nothing); blocks longer than
    the decoding window (16) still train every distance a window slot meets. `learning_rate` None picks 2e-4 for
    LoRA and 2e-5 for full fine-tuning: the paper's 3e-6 is for ~100B tokens, far more than a user's run.
    `eval_share` of the rows (at least one) is held out for the eval loss.
    """

    seq_len: int = 256
    block_size: int = 32
    ar_weight: float | None = None
    suffix_prob: float = 0.5
    lora_r: int = 0
    lora_alpha: int | None = None
    whole_model: bool = False
    """With `lora_r`: an adapter on every token (changes the model; mergeable) instead of a draft-only one."""
    merge: bool = False
    mask_token: str | None = None
    learning_rate: float | None = None
    batch_size: int = 4
    gradient_accumulation_steps: int = 1
    max_steps: int = 100
    minutes: float | None = None
    warmup_steps: float = 0.1
    """Linear warm-up, as `TrainingArguments.warmup_steps`: a step count, or below 1 a share of `max_steps` (0.1: 10
    steps of the default 100, and never the whole of a short run); one that would last the whole run is shortened."""
    eval_share: float = 0.05
    eval_steps: int = 50
    save_steps: int = 50
    logging_steps: int = 10
    bf16: bool = False
    gradient_checkpointing: bool = False
    resume: bool = False
    seed: int = 0
    window_size: int = BY_SETTING["window_size"].default
    entropy_threshold: float | None = None
    """Plain WeDLM's threshold, the only one evaluated; None: the evaluation tries `DEFAULT_THRESHOLDS` (the
    table's default is written unless plain wins at another)."""
    pos_penalty_factor: float = BY_SETTING["pos_penalty_factor"].default
    lossless: bool | None = None
    """The output's default decoding: True lossless WeDLM (exactly its greedy output), False plain WeDLM (commits
    its own mask predictions); None: the one the end-of-run evaluation shows right
    (`wedlm_hf.evaluation.choose_default_decoding`), lossless when not evaluated. A draft-only adapter is always
    lossless: that is what keeps the base model's output."""
    evaluate: bool | None = None
    """Run the decoding evaluation at the end (on `eval_prompts`, else the held-out rows); None: only if the run made
    at least `card.MIN_EVALUATED_STEPS` steps (a shorter one is a trial of the set-up)."""
    eval_repeats: int = 3
    """Timed repeats per decoding in that evaluation (speeds are their median); 1 runs half the decodes 3 runs."""
    eval_prompts: str | None = None
    chat_prompts: str | None = None
    """JSONL of general chat prompts: measure the adapted model's greedy drift from the base model on them."""
    trainer_arguments: dict = field(default_factory=dict)
    """Further `TrainingArguments` (e.g. `deepspeed`, `fsdp`, `report_to`), passed as they are."""


def finetune(model_name: str, data: str, output_dir: str, options: FinetuneOptions | None = None) -> dict:
    """Fine-tune `model_name` on `data` for WeDLM decoding and write the result to `output_dir`.

    Returns the run's summary (also `finetune_summary.json` in the output): steps, tokens, losses, what was
    written. The output loads with `AutoModelForCausalLM.from_pretrained(output_dir)` (an adapter through
    transformers' PEFT integration) and its generation config makes WeDLM decoding the default.
    """
    options = options or FinetuneOptions()
    check_options(options)
    started = time.perf_counter()
    records = read_records(data)  # a bad file fails before the model loads
    model, tokenizer = load_model_and_tokenizer(model_name, dtype=torch.float32)
    mask_id, new_mask = ensure_mask_token(model, tokenizer, options.mask_token, reuse=options.lora_r > 0)
    rows = build_rows(records, tokenizer, options.seq_len)
    train_rows, eval_rows = split_rows(rows, options.eval_share, options.seed)
    draft_only = is_draft_only(options)
    alpha = options.lora_alpha or 2 * options.lora_r
    if draft_only:
        model = with_draft_only_lora(model, options.lora_r, alpha, mask_id)
    elif options.lora_r:
        model = with_lora(model, options.lora_r, alpha, mask_id if new_mask else None)
    ar_weight = options.ar_weight if options.ar_weight is not None else (0.0 if draft_only else 1.0)
    collator = DualStreamCollator(
        mask_id, block_size=options.block_size, ar_weight=ar_weight, suffix_prob=options.suffix_prob, seed=options.seed
    )
    trainer = WeDLMTrainer(
        loss_forward=draft_only_forward if draft_only else dual_stream_forward,
        model=model,
        args=training_arguments(options, output_dir),
        data_collator=collator,
        train_dataset=RowDataset(train_rows),
        eval_dataset=RowDataset(eval_rows),
        processing_class=tokenizer,
        callbacks=[TimeLimit(options.minutes)] if options.minutes else [],
    )
    resume = options.resume and any(Path(output_dir).glob("checkpoint-*"))
    result = trainer.train(resume_from_checkpoint=True if resume else None)
    metrics = trainer.evaluate()
    summary = {
        "base_model": model_name,
        "data": str(data),
        "options": asdict(options),
        "mask_token_id": mask_id,
        "ar_weight": ar_weight,
        "train_rows": len(train_rows),
        "eval_rows": len(eval_rows),
        "steps": trainer.state.global_step,
        "tokens_seen": trainer.state.global_step * options.batch_size * options.gradient_accumulation_steps
        * options.seq_len * trainer.args.world_size,
        "train_loss": result.training_loss,
        "eval_before": next((entry for entry in trainer.state.log_history if "eval_loss" in entry), None),
        "eval": {key: value for key, value in metrics.items() if key.startswith("eval_")},
        "wall_seconds": round(time.perf_counter() - started, 1),
    }
    if trainer.is_world_process_zero():
        # lossless until the evaluation says otherwise, unless the user chose plain
        provisional = replace(options, lossless=options.lossless is not False)
        summary["written"] = save_output(trainer.model, tokenizer, output_dir, provisional, mask_id)
        report = None
        if should_evaluate(options.evaluate, trainer.state.global_step):
            prompts = read_prompts(options.eval_prompts) if options.eval_prompts else held_out_prompts(eval_rows, tokenizer)
            report = evaluate_output(
                output_dir, model_name, prompts, options.chat_prompts, options.entropy_threshold,
                repeats=options.eval_repeats, progress=not trainer.args.disable_tqdm,
            )
            summary["evaluation"] = report.to_dict()
        decoding = default_decoding(options.lossless, options.entropy_threshold, report, is_draft_only(options))
        write_default_decoding(output_dir, decoding)
        summary["default_decoding"] = decoding.to_dict()
        summary["details"] = details(report)
        write_summary(output_dir, summary)
        write_model_card(output_dir, summary, report)
    return summary


def check_options(options: FinetuneOptions) -> None:
    """Bad values fail here, naming the option, not deep inside `Trainer` or the collator."""
    positive = ("seq_len", "block_size", "batch_size", "gradient_accumulation_steps", "max_steps", "eval_repeats")
    for name in positive:
        if getattr(options, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(options, name)}")
    for option in exposed_to(FINETUNE):
        value = getattr(options, option.setting)
        if value is not None and not option.accepts(value):  # None: chosen by the evaluation, or the default
            raise ValueError(f"{option.flag} must be {replace(option.accepts, none_means=None).describe()}, got {value!r}")
    if options.lora_r < 0:
        raise ValueError(f"--lora-r must be 0 (full fine-tuning) or a positive rank, got {options.lora_r}")
    if options.merge and not options.lora_r:
        raise ValueError("--merge merges a LoRA adapter into the model: it needs --lora-r")
    if options.whole_model and not options.lora_r:
        raise ValueError("--whole-model chooses the kind of LoRA adapter: it needs --lora-r")
    if is_draft_only(options):
        if options.lossless is False:
            raise ValueError(
                "--plain: plain WeDLM commits a draft-only adapter's drafts, so the output would no longer be the base "
                "model's; drop --plain (lossless is its default), or pass --whole-model"
            )
        if options.merge:
            raise ValueError("--merge: " + MERGE_REFUSED)
        if options.ar_weight:
            raise ValueError(
                "--ar-weight: a draft-only adapter leaves every observed token on the base weights, so the AR loss "
                "trains nothing; drop --ar-weight, or pass --whole-model"
            )
        if options.gradient_checkpointing:
            raise ValueError(
                "--gradient-checkpointing: a draft-only adapter's memory stream runs without autograd and hands its "
                "K/V to the prediction stream as a cache, which checkpointing drops; drop it, or pass --whole-model"
            )
    if options.warmup_steps < 0:
        raise ValueError(f"--warmup-steps must be a step count or a share of --max-steps below 1, got {options.warmup_steps}")
    if not 0 <= options.eval_share < 1:
        raise ValueError(f"--eval-share must be in [0, 1), got {options.eval_share}")
    for name in ("eval_prompts", "chat_prompts"):
        if getattr(options, name) and not Path(getattr(options, name)).expanduser().is_file():
            raise FileNotFoundError(f"--{name.replace('_', '-')} {getattr(options, name)}: no such file")
    if options.minutes is not None and options.minutes <= 0:
        raise ValueError(f"--minutes must be positive, got {options.minutes}")


def is_draft_only(options: FinetuneOptions) -> bool:
    return bool(options.lora_r) and not options.whole_model


def split_rows(rows: list[dict], eval_share: float, seed: int) -> tuple[list[dict], list[dict]]:
    """A seeded split: `eval_share` of the rows (at least one when there are two or more) for the eval loss."""
    if not rows:
        raise ValueError("--data holds no records")
    order = torch.randperm(len(rows), generator=torch.Generator().manual_seed(seed)).tolist()
    held_out = max(1, round(len(rows) * eval_share)) if eval_share > 0 and len(rows) > 1 else 0
    return [rows[i] for i in order[held_out:]], [rows[i] for i in order[:held_out]] or [rows[order[0]]]


def training_arguments(options: FinetuneOptions, output_dir: str) -> TrainingArguments:
    learning_rate = options.learning_rate or (2e-4 if options.lora_r else 2e-5)
    arguments = dict(
        output_dir=output_dir,
        max_steps=options.max_steps,
        per_device_train_batch_size=options.batch_size,
        per_device_eval_batch_size=options.batch_size,
        gradient_accumulation_steps=options.gradient_accumulation_steps,
        learning_rate=learning_rate,
        lr_scheduler_type="cosine",
        warmup_steps=options.warmup_steps,
        weight_decay=0.0,
        max_grad_norm=1.0,
        logging_steps=options.logging_steps,
        eval_strategy="steps",
        eval_steps=options.eval_steps,
        eval_on_start=True,  # the eval loss before training, for the summary's before/after
        save_strategy="steps",
        save_steps=options.save_steps,
        save_total_limit=2,
        bf16=options.bf16,
        **{CHECKPOINTING_ARGUMENT: options.gradient_checkpointing},
        remove_unused_columns=False,  # `maskable` is the collator's, not the model's
        prediction_loss_only=True,
        seed=options.seed,
        use_cpu=not torch.accelerator.is_available(),  # else torchrun on a CPU machine runs N separate jobs, not DDP
        report_to=[],
        disable_tqdm=False,
    )
    arguments.update(options.trainer_arguments)
    args = TrainingArguments(**arguments)
    fit_warmup(args)
    return args


def save_output(model, tokenizer: PreTrainedTokenizerBase, output_dir: str, options: FinetuneOptions, mask_id: int) -> str:
    """Write the adapter (draft-only or whole-model LoRA), or the merged/full model, with the tokenizer and WeDLM
    generation defaults; returns which of the three it wrote."""
    output = Path(output_dir)
    kind = "draft-only adapter" if is_draft_only(options) else "adapter" if options.lora_r and not options.merge else "model"
    if options.lora_r and options.merge:
        model = model.merge_and_unload()
    base = model.get_base_model() if kind.endswith("adapter") else model
    base.generation_config = wedlm_generation_config(base.generation_config, options, mask_id)
    model.save_pretrained(output)
    base.generation_config.save_pretrained(output)
    tokenizer.save_pretrained(output)
    return kind


def wedlm_generation_config(config: GenerationConfig, options: FinetuneOptions, mask_id: int) -> GenerationConfig:
    """The model's generation config with WeDLM decoding (plain or lossless, and these window settings; the table's
    default where an option is None) as its default."""
    config = GenerationConfig.from_dict(config.to_dict())
    config._from_model_config = False  # else loading rebuilds it from the model config, dropping these
    config.decoding = "wedlm"
    config.mask_token_id = mask_id
    # the mask is an input only, but its (tied or trained) output row can win an argmax after training on it
    config.suppress_tokens = sorted({*(config.suppress_tokens or []), mask_id})
    for option in exposed_to(FINETUNE):
        value = getattr(options, option.setting)
        setattr(config, option.keyword, option.default if value is None else value)
    return config
