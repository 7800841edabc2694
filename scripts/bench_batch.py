"""What batching buys on this machine: WeDLM's decoding modes against batched greedy decoding, per batch size, and
(`--batch-generate`, issue 15) `batch_generate` and the CLI's processes against a per-prompt loop.

Default (issue 47): on the embedded checkpoint, counting and held-out code prompts at batch 1, 8 and 32 (left-padded,
one `generate` call per batch; code prompts are those greedy decoding continues for the whole budget, repeated
where the held-out files give fewer), interleaved repeats of
batched greedy `generate()`, lossless WeDLM (`wedlm_lossless=True`, whose draft width the forward cost model prices
per batch size) and plain WeDLM (the checkpoint's settings); prints the cost model's table, then tokens/s, each
mode's median paired speed ratio to greedy and its tokens per forward, and whether lossless equals greedy.

`--batch-generate` (issue 15): held-out stdlib code prompts (greedy WeDLM, the checkpoint's settings), times, in
one run and interleaved per repeat, a per-prompt loop of `model.generate`, `wedlm_hf.batch_generate` at batch sizes
1/4/16 (one process), and the CLI on one process vs two (`accelerate launch --multi_gpu --num_processes 2`, which
on a CPU-only machine starts two gloo processes); the CLI arms time generation only (the summary line), not the
model load. Prints rows/s, tokens/s and the median paired ratio of each arm's tokens/s to the per-prompt loop (the
2-process arm: to the 1-process CLI arm). Every process runs one torch thread.

    python scripts/bench_batch.py [--batches 1,8,32] [--new-tokens 96] [--repeats 3]
    python scripts/bench_batch.py --batch-generate [--rows 32] [--new-tokens 32] [--repeats 2] [--cli-batch-size 4]
"""

import argparse
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationMixin
from transformers.utils import logging

import wedlm_hf
from wedlm_hf.bench.measure import cost_model_info
from wedlm_hf.bench.prompts import code_prompts, counting_prompts
from wedlm_hf.bench.report import cost_model_markdown

BIN = Path(sys.executable).parent
SUMMARY = re.compile(r"generation ([\d.]+) s, ([\d.]+) rows/s, ([\d.]+) tokens/s")


@torch.inference_mode()  # as batch_generate runs, so the ratio measures batching alone
def per_prompt_loop(model, tokenizer, prompts: list[str], new_tokens: int) -> int:
    tokens = 0
    for prompt in prompts:
        inputs = tokenizer(prompt, return_tensors="pt")
        output = model.generate(**inputs, max_new_tokens=new_tokens, do_sample=False, return_dict_in_generate=True)
        tokens += output.wedlm_stats.total_generated
    return tokens


def batched(model, tokenizer, prompts: list[str], new_tokens: int, batch_size: int) -> int:
    results = wedlm_hf.batch_generate(model, tokenizer, prompts, batch_size=batch_size, max_new_tokens=new_tokens)
    return sum(result["stats"]["tokens"] for result in results)


def cli(source: Path, processes: int, new_tokens: int, batch_size: int) -> tuple[float, float]:
    """rows/s and tokens/s of the CLI's generation phase, read from its summary line."""
    output = source.with_suffix(f".{processes}.out.jsonl")
    launcher = [str(BIN / "wedlm-hf")]
    if processes > 1:
        launcher = [str(BIN / "accelerate"), "launch", "--multi_gpu", "--num_processes", str(processes),
                    "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
                    "--main_process_port", str(free_port()), "-m", "wedlm_hf.cli"]
    command = [*launcher, "generate", "--input", str(source), "--output", str(output), "--overwrite",
               "--max-new-tokens", str(new_tokens), "--batch-size", str(batch_size), "--no-progress"]
    run = subprocess.run(command, env=dict(os.environ, OMP_NUM_THREADS="1"), capture_output=True, text=True)
    match = SUMMARY.search(run.stderr)
    if run.returncode or not match:
        raise RuntimeError(f"{' '.join(command)} failed:\n{run.stderr[-6000:]}")
    return float(match.group(2)), float(match.group(3))


def free_port() -> int:
    """A port no other job on the machine holds (accelerate's default 29500 may be taken)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def new_tokens_of(sequences: torch.Tensor, prompt_length: int, eos_id: int | None) -> int:
    """Tokens a batch generated: each row's up to and including its first EOS (the rest is padding)."""
    tokens = 0
    for row in sequences[:, prompt_length:].tolist():
        tokens += row.index(eos_id) + 1 if eos_id in row else len(row)
    return tokens


def full_length(model, tokenizer, prompts: list[str], new_tokens: int) -> list[str]:
    """The prompts whose greedy continuation runs the whole budget: one the model ends at once (two held-out code
    prompts end after one token) would time its prompt's forward, not decoding, at batch 1."""
    _, _, _, sequences = decode(model, tokenizer(prompts, return_tensors="pt", padding=True), new_tokens, "greedy")
    eos_id = model.config.eos_token_id
    return [prompt for prompt, row in zip(prompts, sequences[:, -new_tokens:].tolist()) if eos_id not in row]


@torch.inference_mode()
def decode(model, inputs, new_tokens: int, mode: str) -> tuple[float, int, int, torch.Tensor]:
    """Seconds, tokens generated, forwards (0 for greedy) and the sequences of one batched decode in `mode`."""
    start = time.perf_counter()
    if mode == "greedy":  # transformers' own greedy decoding (the enabled model's `generate` is WeDLM's)
        sequences = GenerationMixin.generate(model, **inputs, max_new_tokens=new_tokens, do_sample=False)
        seconds = time.perf_counter() - start
        return seconds, new_tokens_of(sequences, inputs["input_ids"].shape[1], model.config.eos_token_id), 0, sequences
    output = model.generate(
        **inputs, max_new_tokens=new_tokens, do_sample=False, decoding="wedlm", wedlm_lossless=mode == "lossless",
        return_dict_in_generate=True,
    )
    seconds = time.perf_counter() - start
    stats = output.wedlm_stats
    return seconds, stats.total_generated, stats.model_calls, output.sequences


def decoding_modes(args) -> None:
    """Issue 47's table: lossless and plain WeDLM against batched greedy decoding at each batch size."""
    tokenizer = AutoTokenizer.from_pretrained(wedlm_hf.DEFAULT_MODEL, padding_side="left")
    model = AutoModelForCausalLM.from_pretrained(wedlm_hf.DEFAULT_MODEL).eval()
    batches = [int(size) for size in args.batches.split(",")]
    largest = max(batches)
    code = full_length(model, tokenizer, code_prompts(largest), args.new_tokens)
    sets = {"counting": counting_prompts(largest), "code": (code * largest)[:largest]}
    modes = ("greedy", "lossless", "plain")
    print(cost_model_markdown(cost_model_info(model)) + "\n")
    print(f"embedded checkpoint, {args.new_tokens} new tokens, {args.repeats} interleaved repeats, "
          f"{torch.get_num_threads()} torch thread(s); medians, speed ratios paired per repeat")
    print("| prompts | batch | greedy tokens/s | lossless vs greedy | lossless tokens/forward | plain vs greedy "
          "| plain tokens/forward | lossless identical to greedy |\n|---|---|---|---|---|---|---|---|")
    for name, prompts in sets.items():
        for size in batches:
            inputs = tokenizer(prompts[:size], return_tensors="pt", padding=True)
            first = {mode: decode(model, inputs, args.new_tokens, mode) for mode in modes}  # warm-up, and outputs
            speeds = {mode: [] for mode in modes}
            for repeat in range(args.repeats):
                for mode in modes[repeat % 3 :] + modes[: repeat % 3]:
                    seconds, tokens, _, _ = decode(model, inputs, args.new_tokens, mode)
                    speeds[mode].append(tokens / seconds)
            ratio = {mode: statistics.median(s / g for s, g in zip(speeds[mode], speeds["greedy"])) for mode in modes}
            per_forward = {mode: first[mode][1] / first[mode][2] for mode in ("lossless", "plain")}
            identical = torch.equal(first["lossless"][3], first["greedy"][3])
            print(f"| {name} | {size} | {statistics.median(speeds['greedy']):.1f} | {ratio['lossless']:.2f}x "
                  f"| {per_forward['lossless']:.2f} | {ratio['plain']:.2f}x | {per_forward['plain']:.2f} "
                  f"| {'yes' if identical else 'NO'} |", flush=True)


def batch_generate_arms(args) -> None:
    """Issue 15's table: `batch_generate` and the CLI's processes against a per-prompt loop."""
    tokenizer = AutoTokenizer.from_pretrained(wedlm_hf.DEFAULT_MODEL)
    model = AutoModelForCausalLM.from_pretrained(wedlm_hf.DEFAULT_MODEL).eval()
    prompts = code_prompts(args.rows)
    arms = {
        "per-prompt loop": lambda: per_prompt_loop(model, tokenizer, prompts, args.new_tokens),
        **{
            f"batch_generate, batch {size}": (lambda size=size: batched(model, tokenizer, prompts, args.new_tokens, size))
            for size in (1, 4, 16)
        },
    }
    batched(model, tokenizer, prompts[:4], args.new_tokens, 4)  # warm-up: first-call costs belong to no arm
    speeds: dict[str, list[tuple[float, float]]] = {name: [] for name in [*arms, "CLI, 1 process", "CLI, 2 processes"]}
    with tempfile.TemporaryDirectory() as folder:
        source = Path(folder) / "rows.jsonl"
        source.write_text("".join(json.dumps({"id": i, "prompt": p}) + "\n" for i, p in enumerate(prompts)))
        for repeat in range(args.repeats):
            for name, arm in arms.items():
                start = time.perf_counter()
                tokens = arm()
                seconds = time.perf_counter() - start
                speeds[name].append((len(prompts) / seconds, tokens / seconds))
            for processes in (1, 2):
                label = f"CLI, {processes} process{'es' if processes > 1 else ''}"
                speeds[label].append(cli(source, processes, args.new_tokens, args.cli_batch_size))
            print(f"repeat {repeat + 1}/{args.repeats} done", file=sys.stderr)

    print(f"{len(prompts)} code prompts, {args.new_tokens} new tokens max, embedded checkpoint, "
          f"{args.repeats} interleaved repeats, 1 torch thread per process; CLI arms at --batch-size {args.cli_batch_size}")
    print("| arm | rows/s | tokens/s | tokens/s vs baseline (median paired ratio) |")
    print("|---|---|---|---|")
    for name, runs in speeds.items():
        baseline = speeds["CLI, 1 process" if name == "CLI, 2 processes" else "per-prompt loop"]
        ratio = statistics.median(t / b for (_, t), (_, b) in zip(runs, baseline))
        against = "1-process CLI" if name == "CLI, 2 processes" else "per-prompt loop"
        print(f"| {name} | {statistics.median(r for r, _ in runs):.2f} | {statistics.median(t for _, t in runs):.1f} "
              f"| {ratio:.2f}x ({against}) |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-generate", action="store_true", help="issue 15's table instead (see the docstring)")
    parser.add_argument("--batches", default="1,8,32", help="batch sizes of the decoding modes' table")
    parser.add_argument("--rows", type=int, default=32, help="--batch-generate: code prompts")
    parser.add_argument("--new-tokens", type=int, default=None, help="default 96 (--batch-generate: 32)")
    parser.add_argument("--repeats", type=int, default=None, help="default 3 (--batch-generate: 2)")
    parser.add_argument("--cli-batch-size", type=int, default=4)
    args = parser.parse_args()
    args.new_tokens = args.new_tokens or (32 if args.batch_generate else 96)
    args.repeats = args.repeats or (2 if args.batch_generate else 3)
    torch.set_num_threads(1)
    logging.disable_progress_bar()
    if args.batch_generate:
        batch_generate_arms(args)
    else:
        decoding_modes(args)


if __name__ == "__main__":
    main()
