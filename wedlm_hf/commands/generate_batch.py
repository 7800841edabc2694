"""`wedlm-hf generate --input rows.jsonl --output out.jsonl`: the batch mode of `generate`, on one process or many.

Data parallel: run the same command under `accelerate launch --num_processes N`; each process loads the model once
on its own device and takes its share of each round of batches, and the main process alone writes the output.
Tensor parallel: `--tp` under `torchrun --nproc_per_node N` loads one model sharded over the processes
(transformers' `tp_plan="auto"`); every process runs every batch, the main process writes.
"""

import argparse
import dataclasses
import json
import os
import sys
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from ..batch.rows import PromptRow

BATCH_OPTIONS = ("input", "output", "batch_size", "max_padded_tokens", "resume", "overwrite", "tp", "no_progress")
SINGLE_PROMPT_ONLY = {
    "prompt_file": "--prompt-file gives one prompt; with --input the prompts are the rows",
    "stream": "--stream prints one continuation as it is decoded; with --input the results go to --output",
}
"""The `generate` options that only make sense for one prompt: refused with --input, not ignored. Every other one
(the WeDLM options of `wedlm_hf.generation.options`, the mode, sampling, --chat, --seed, placement) applies to every
row, read by the same code as for one prompt."""


def uses_batch_mode(args: argparse.Namespace) -> bool:
    """True when any batch option is set, so `generate` hands over (and a batch option without --input is refused)."""
    return any(getattr(args, key) != args.batch_parser.get_default(key) for key in BATCH_OPTIONS)


def add_batch_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("batch mode (--input)")
    group.add_argument("--input", default=None, help='JSONL file, one {"id"?, "prompt" | "messages", overrides?} a line')
    group.add_argument("--output", default=None, help="JSONL file of results, one line per input row")
    group.add_argument("--batch-size", type=int, default=8, help="rows per generate call (default 8)")
    group.add_argument("--max-padded-tokens", type=int, default=None,
                       help="also cap rows x (longest prompt + max_new_tokens) per batch")
    group.add_argument("--resume", action="store_true", help="keep the rows already in --output, generate the rest")
    group.add_argument("--overwrite", action="store_true", help="replace an existing --output")
    group.add_argument("--tp", action="store_true", help="tensor parallel over the processes of `torchrun`")
    group.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.set_defaults(batch_parser=parser)


def _check_arguments(args: argparse.Namespace) -> None:
    for key, reason in SINGLE_PROMPT_ONLY.items():
        if getattr(args, key) != args.batch_parser.get_default(key):
            raise ValueError(f"{reason}: drop one or the other.")
    if not args.input:
        raise ValueError("--output, --batch-size, --resume, --tp and the other batch options need --input.")
    if args.prompt is not None:
        raise ValueError("give either a prompt or --input, not both.")
    if not args.output:
        raise ValueError("--input needs --output (the JSONL file to write).")
    if os.path.abspath(args.input) == os.path.abspath(args.output):
        raise ValueError("--output must differ from --input.")
    if not os.path.isfile(args.input):
        raise ValueError(f"--input {args.input}: no such file.")
    if args.resume and args.overwrite:
        raise ValueError("--resume keeps --output, --overwrite replaces it: choose one.")
    if args.batch_size < 1:
        raise ValueError(f"--batch-size must be >= 1, got {args.batch_size}.")
    if args.max_padded_tokens is not None and args.max_padded_tokens < 1:
        raise ValueError(f"--max-padded-tokens must be >= 1, got {args.max_padded_tokens}.")
    if os.path.exists(args.output) and os.path.getsize(args.output) and not (args.resume or args.overwrite):
        raise ValueError(f"--output {args.output} already exists: pass --resume to continue it or --overwrite.")


def _load(args: argparse.Namespace, state, device: "torch.device | None"):
    from transformers import DistributedConfig

    import wedlm_hf

    from ..loading import load_model_and_tokenizer

    if device is not None and (args.tp or state.num_processes > 1):
        raise ValueError("--device places one process's model; under a launcher each process takes its own device.")
    if args.tp:
        if state.num_processes < 2:
            raise ValueError("--tp shards the model over processes: launch with `torchrun --nproc_per_node N`.")
        placement = {"distributed_config": DistributedConfig(tp_plan="auto")}
    elif device is not None:
        placement = {"device_map": {"": device}}
    else:
        placement = {"device_map": {"": state.device}}
    model, tokenizer = load_model_and_tokenizer(args.model, dtype=args.dtype, **placement)
    return wedlm_hf.enable(model), tokenizer


def _interrupted(args: argparse.Namespace, unwritten: bool) -> str:
    """What an interrupted job left in --output (`unwritten`: --overwrite had not emptied it yet), and how to go on."""
    if unwritten:
        return f"--output {args.output} is as it was"
    instead = " instead of --overwrite" if args.overwrite else ""
    return f"--output {args.output} keeps the rows finished so far: rerun with --resume{instead} to generate the rest"


def as_chat(row: "PromptRow") -> "PromptRow":
    """--chat: a prompt row as one user message, through the chat template like a "messages" row."""
    if row.prompt is None:
        return row
    return dataclasses.replace(row, prompt=None, messages=[{"role": "user", "content": row.prompt}])


def run_batch(args: argparse.Namespace, options: dict, device: "torch.device | None" = None) -> int:
    """Generate every row of --input not yet in --output with the `generate` keywords `options`, on `device`
    (None: the launcher's); an error is one line on stderr (from the main process) and exit status 1, as for every
    command."""
    from accelerate.utils import broadcast_object_list
    from transformers import set_seed
    from transformers.utils import logging

    from ..batch import RowError, generate_in_rounds, read_rows
    from ..batch.generate import process_state
    from ..batch.output import append_results, done_ids, sort_output

    logging.disable_progress_bar()
    state = process_state()
    replace = args.overwrite  # the old output goes only once the new one has something to say
    try:
        _check_arguments(args)
        rows = read_rows(args.input)
        done = [set(), None]  # ids already written, or the error reading them: every process must learn either
        if state.is_main_process and not args.overwrite:  # the output may live on the main node only
            try:
                done[0] = done_ids(args.output)
            except (RowError, OSError) as error:
                done[1] = str(error)
        broadcast_object_list(done)
        if done[1]:
            raise ValueError(done[1])
        input_ids = {json.dumps(row.id) for row in rows}
        strangers = done[0] - input_ids
        if strangers:
            raise ValueError(
                f"--output {args.output} holds {len(strangers)} id(s) not in --input (e.g. {min(strangers)}): "
                "is it the output of another input file?"
            )
        todo = [as_chat(row) if args.chat else row for row in rows if json.dumps(row.id) not in done[0]]
        model, tokenizer = _load(args, state, device)
        if args.chat and not getattr(tokenizer, "chat_template", None):
            raise ValueError("--chat: this tokenizer has no chat template; drop --chat")
        if args.seed is not None:
            set_seed(args.seed)
        rounds = generate_in_rounds(
            model, tokenizer, todo, batch_size=args.batch_size, max_padded_tokens=args.max_padded_tokens,
            progress=not args.no_progress, **options,
        )
        rows_per_process, tokens, start = [0] * state.num_processes, 0, time.perf_counter()
        for finished, work in rounds:
            for done_by in work:
                rows_per_process[done_by.process] += done_by.rows
                tokens += done_by.tokens
            if state.is_main_process:
                if replace:
                    open(args.output, "w").close()
                    replace = False
                append_results(args.output, [result for _, result in sorted(finished, key=lambda pair: pair[0])])
    except (RowError, ValueError, OSError, ImportError) as error:
        if state.is_main_process:
            print(f"wedlm-hf generate: error: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        if state.is_main_process:
            print(f"wedlm-hf generate: interrupted; {_interrupted(args, replace)}", file=sys.stderr)
        return 130
    seconds = time.perf_counter() - start
    if state.is_main_process:
        if replace or not os.path.exists(args.output):
            open(args.output, "w").close()  # an empty input gives an empty output
        sort_output(args.output, rows)
        shares = ", ".join(f"process {i}: {count}" for i, count in enumerate(rows_per_process))
        if args.tp:
            shares = f"one model sharded over {model.tp_size} processes"
        print(
            f"{len(todo)} rows generated ({shares}), {len(rows) - len(todo)} already done; wrote {args.output}; "
            f"generation {seconds:.2f} s, {len(todo) / seconds:.2f} rows/s, {tokens / seconds:.1f} tokens/s",
            file=sys.stderr,
        )
    if state.num_processes > 1:  # leave together: a process exiting under a peer's live gloo group can abort it
        state.wait_for_everyone()
        state.destroy_process_group()
    return 0
