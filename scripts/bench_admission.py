"""Admission and exit cost of continuous batching, and its peak memory: the K/V pool against the growing cache.

Admission: the time to admit one request (its first step, prompt and first window, and its join) while N rows of
256-token contexts run, N = 1, 8, 32, for the growing cache (`kv_pool=False`: every admission concatenates every
running row's K/V, every exit index-selects them) and for the block pool (`kv_pool=True`: the new row's blocks
written, the leaving row's freed); the join alone (`DecodeLoop.join`, where the copying happens); the time for the
request to leave again (exit); and one step of the N rows (the pool's forwards gather each row's blocks, the
growing cache's read its own tensors). Medians of interleaved repeats (every path and N in turn, so a busy moment of a shared machine falls on
all of them); each figure's ratio to its path's N=1 figure beside it.

Memory: 32 requests (256-token prompts, `--new-tokens` each) arriving one per step, for the growing cache and the
block pool: the peak of live tensor bytes during the run (torch's profiler: K/V, activations, records; the model's
weights, allocated before, not counted) and the pool's own K/V bytes, against the sum of the requests' own K/V
needs (prompt + generated tokens, times the model's K/V bytes per token). `scripts/kv_memory.py` measures the pool
on requests of mixed lengths.

    python scripts/bench_admission.py                  # the embedded checkpoint, 1 thread
    python scripts/bench_admission.py --repeats 5      # a quicker run
"""

import argparse
import copy
import random
import statistics
import time

import torch
from transformers import AutoModelForCausalLM

import wedlm_hf
from wedlm_hf.continuous import GenerationRequest, WeDLMScheduler
from wedlm_hf.generation.loop import DecodeLoop

CONTEXT = 256
RUNNING_BUDGET = 256
ROWS = (1, 8, 32)
PATHS = {False: "growing cache", True: "pool"}


def prompt(rng: random.Random, vocab: int) -> list[int]:
    return [rng.randrange(3, vocab) for _ in range(CONTEXT)]


def running_batch(model, config, rows: int, kv_pool: bool, rng: random.Random, vocab: int) -> WeDLMScheduler:
    """A scheduler whose batch runs `rows` rows of 256-token prompts (admitted together, first step done)."""
    scheduler = WeDLMScheduler(
        model, config, max_batch_size=rows + 1, max_sequence_length=CONTEXT + RUNNING_BUDGET, kv_pool=kv_pool
    )
    for _ in range(rows):
        scheduler.add(GenerationRequest(prompt(rng, vocab), RUNNING_BUDGET))
    scheduler.step()
    assert len(scheduler.running) == rows, "a running row ended before the measurement"
    return scheduler


class TimedJoin:
    """`DecodeLoop.join`, timed: the seconds of the last call in `seconds`."""

    def __init__(self):
        self.join, self.seconds = DecodeLoop.join, 0.0
        DecodeLoop.join = lambda loop, other: self(loop, other)

    def __call__(self, loop: DecodeLoop, other: DecodeLoop) -> None:
        start = time.perf_counter()
        self.join(loop, other)
        self.seconds = time.perf_counter() - start


@torch.no_grad()
def admit_leave_step(scheduler: WeDLMScheduler, request: GenerationRequest, join: TimedJoin) -> list[float]:
    """Seconds to admit `request` into the running batch, to join it, for it to leave again (cancelled,
    forgotten), and for one step of the rows that ran before."""
    batch = scheduler.batch
    start = time.perf_counter()
    batch.start([request])
    admitted = time.perf_counter()
    row = batch.rows - 1
    batch.cancel([row])
    batch.forget([row])
    left = time.perf_counter()
    batch.step()
    return [admitted - start, join.seconds, left - admitted, time.perf_counter() - left]


def admission_table(model, config, repeats: int, vocab: int) -> None:
    rng = random.Random(0)
    batches = {
        (kv_pool, rows): running_batch(model, config, rows, kv_pool, rng, vocab) for kv_pool in PATHS for rows in ROWS
    }
    times, join = {key: [] for key in batches}, TimedJoin()
    for repeat in range(repeats + 1):  # the first round warms up
        for key, scheduler in batches.items():
            seconds = admit_leave_step(scheduler, GenerationRequest(prompt(rng, vocab), 16), join)
            if repeat:
                times[key].append(seconds)
    ended = sum(rows - batches[(kv_pool, rows)].batch.loop.running for kv_pool, rows in batches)
    print(f"\nAdmitting one request (256-token prompt) while N rows of 256-token contexts run; medians of {repeats}"
          f" ({ended} of the N rows ended meanwhile)")
    print("| path | N | admit ms | vs N=1 | of which join ms | vs N=1 | exit ms | vs N=1 | step ms | vs N=1 |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for kv_pool, name in PATHS.items():
        first = [statistics.median(column) for column in zip(*times[(kv_pool, ROWS[0])])]
        for rows in ROWS:
            medians = [statistics.median(column) for column in zip(*times[(kv_pool, rows)])]
            cells = " | ".join(f"{m * 1e3:.2f} | {m / f:.2f}x" for m, f in zip(medians, first))
            print(f"| {name} | {rows} | {cells} |")


def peak_tensor_bytes(run) -> int:
    """The most tensor bytes alive at once while `run()` runs, above what was alive before (torch's profiler)."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as profiler:
        run()
    live = peak = 0
    for event in sorted(profiler.events(), key=lambda e: e.time_range.start):  # each op's own allocations net of
        live += event.self_cpu_memory_usage  # its frees, at its start; "[memory]" events: those outside any op
        peak = max(peak, live)
    return peak


def memory_table(model, config, new_tokens: int, vocab: int) -> None:
    text = model.config.get_text_config()
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    per_token = 2 * text.num_hidden_layers * text.num_key_value_heads * head_dim * model.dtype.itemsize
    print(f"\n32 requests (256-token prompts, {new_tokens} new tokens), one arriving per step; K/V {per_token} B/token")
    print("| path | K/V needs MB | peak tensors MB | vs needs | pool K/V MB | vs needs |\n|---|---|---|---|---|---|")
    for kv_pool, name in PATHS.items():
        rng = random.Random(1)
        scheduler = WeDLMScheduler(model, config, max_batch_size=32, kv_pool=kv_pool)
        requests = [GenerationRequest(prompt(rng, vocab), new_tokens) for _ in range(32)]
        results, most_running = {}, []

        def run():
            for step in range(10_000):
                if step < len(requests):
                    scheduler.add(requests[step])
                for update in scheduler.step():
                    if update.finished:
                        results[update.request_id] = update.result
                most_running.append(len(scheduler.running))
                if len(results) == len(requests):
                    return

        peak = peak_tensor_bytes(run)
        needs = sum((CONTEXT + len(result.tokens)) * per_token for result in results.values())
        pool = "-"
        if kv_pool:
            pool_bytes = sum(t.numel() * t.element_size() for layer in scheduler.batch.pool.cache.layers
                             for t in (layer.keys, layer.values))
            pool = f"{pool_bytes / 2**20:.1f} | {pool_bytes / needs:.2f}x"
        print(f"| {name} | {needs / 2**20:.1f} | {peak / 2**20:.1f} | {peak / needs:.2f}x | {pool} |"
              f"  (most running at once: {max(most_running)})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=wedlm_hf.DEFAULT_MODEL)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model = wedlm_hf.enable(AutoModelForCausalLM.from_pretrained(args.model).eval())
    config = copy.deepcopy(model.generation_config)
    vocab = model.config.get_text_config().vocab_size
    admission_table(model, config, args.repeats, vocab)
    memory_table(model, config, args.new_tokens, vocab)


if __name__ == "__main__":
    main()
