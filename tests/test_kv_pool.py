"""Continuous batching's K/V pool of blocks (generation/pool.py, kv_pool.py, kv_blocks.py) and transactional
joins (`DecodeLoop.join`): a row holds blocks for the positions it reached, not its budget; admitting a request
writes only the blocks it takes, an exit moves no K/V and frees the row's blocks, which later rows take again; a
row's attention reads its own blocks alone; a fault while a request joins fails that request alone; a request's
record is as wide as its budget. Every request still decodes what a `generate` call of its own decodes."""

import pytest
import torch
from test_continuous_batching import (
    ARRIVALS, BUDGETS, PROMPTS, WINDOW, assert_alone_equal, run_staggered, server_config,
)
from tiny_models import tiny_model

import wedlm_hf
from wedlm_hf.continuous import GenerationRequest, WeDLMScheduler
from wedlm_hf.continuous.batch import RunningBatch
from wedlm_hf.generation import pool as pool_module
from wedlm_hf.generation.cache import WeDLMCache
from wedlm_hf.generation.kv_blocks import blocks_for
from wedlm_hf.generation.lossless import LosslessPolicy
from wedlm_hf.generation.kv_pool import KVPool
from wedlm_hf.generation.pool import SPARE, PoolBackend
from wedlm_hf.generation.record import OutputRecord
from wedlm_hf.generation.transformers_version import CACHE_KEYWORD

LONG_PROMPTS = [list(range(3, 3 + n)) for n in (37, 5, 21, 2, 50, 13)]
"""Prompts over several blocks of 4 positions (the block size these tests patch in) and within one."""


def requests_of(prompts, budgets):
    return [GenerationRequest(p, b, request_id=str(i)) for i, (p, b) in enumerate(zip(prompts, budgets))]


def pool_tensors(scheduler) -> list[torch.Tensor]:
    return [tensor for layer in scheduler.batch.pool.cache.layers for tensor in (layer.keys, layer.values)]


def block_slots(pool: PoolBackend, blocks: list[int]) -> torch.Tensor:
    size = pool.cache.blocks.block_size
    return (torch.tensor(blocks, dtype=torch.long)[:, None] * size + torch.arange(size)).flatten()


@pytest.mark.parametrize("wedlm", [{}, {"wedlm_lossless": True}], ids=str)
def test_admission_writes_only_its_blocks_and_exit_moves_nothing(monkeypatch, wedlm):
    """Across every admission and exit: an admission changes no byte outside the blocks it hands out (which were
    free); an exit changes no byte and frees the row's blocks, which later admissions take again; the running
    rows' blocks are disjoint and, with the free ones, the whole pool; every forward feeds the running rows
    alone."""
    monkeypatch.setattr(pool_module, "BLOCK_SIZE", 4)
    model = wedlm_hf.enable(tiny_model("wedlm"))
    config = server_config(model, **wedlm)
    scheduler = WeDLMScheduler(model, config, max_batch_size=3)
    pool = scheduler.batch.pool
    blocks = pool.cache.blocks
    monkeypatch.setattr(WeDLMCache, "joined", None)  # the growing cache's concatenation is never reached
    admissions, exits, fed_rows, freed = [], [], [], set()
    start, select_rows = RunningBatch.start, PoolBackend.select_rows

    def watched_start(batch, group):  # records what it sees (an exception here would fail the request)
        before = [t.clone() for t in pool_tensors(scheduler)] if pool.cache.end is not None else []
        held, free, capacity = [list(row) for row in blocks.held], set(blocks.free), blocks.capacity
        start(batch, group)
        taken = {block for row in blocks.held[len(held) :] for block in row}
        untouched = block_slots(pool, sorted(set(range(capacity)) - taken))
        admissions.append((
            taken,
            blocks.held[: len(held)] == held and taken <= free | set(range(capacity, blocks.capacity)),
            all(torch.equal(old[untouched], now[untouched]) for old, now in zip(before, pool_tensors(scheduler))),
            bool(taken & freed),
        ))

    def watched_select_rows(backend, index, kept):
        before = [t.clone() for t in pool_tensors(scheduler)]
        leaving = {block for row, held in enumerate(blocks.held) if row not in kept for block in held}
        select_rows(backend, index, kept)
        same = all(torch.equal(old, now) for old, now in zip(before, pool_tensors(scheduler)))
        exits.append(same and leaving <= set(blocks.free))
        freed.update(leaving)

    def count_fed_rows(_, args, kwargs):
        if isinstance(kwargs.get(CACHE_KEYWORD), KVPool):
            fed_rows.append((kwargs["input_ids"].shape[0], len(blocks.held)))

    def disjoint(s):
        held = [block for row in blocks.held for block in row]
        assert len(held) == len(set(held)) and sorted(held + blocks.free) == list(range(blocks.capacity))

    monkeypatch.setattr(RunningBatch, "start", watched_start)
    monkeypatch.setattr(PoolBackend, "select_rows", watched_select_rows)
    model.register_forward_pre_hook(count_fed_rows, with_kwargs=True)
    requests = requests_of(LONG_PROMPTS, BUDGETS)
    results = run_staggered(scheduler, requests, ARRIVALS, disjoint)
    assert_alone_equal(model, config, requests, results)
    assert len(admissions) >= 4 and all(from_free and unchanged for _, from_free, unchanged, _ in admissions)
    assert any(len(taken) > 1 for taken, *_ in admissions), "a request takes several blocks"
    assert exits and all(exits), "an exit moved K/V or kept blocks"
    assert any(reused for *_, reused in admissions), "freed blocks are taken again"
    assert fed_rows and all(fed == running for fed, running in fed_rows), "a forward fed rows that are not running"
    assert blocks.held == [] and sorted(blocks.free) == list(range(blocks.capacity))


def test_blocks_follow_each_rows_positions_not_its_budget(monkeypatch):
    """Each running row holds blocks for its own K/V and the window it feeds, whatever its budget (one request may
    run to 200 tokens, another stops at 12) or the position limit; the pool holds what the rows hold plus one
    block in `SPARE` (and what a row that left held until another takes it)."""
    monkeypatch.setattr(pool_module, "BLOCK_SIZE", 4)
    model = wedlm_hf.enable(tiny_model("llama"))
    config = server_config(model, wedlm_lossless=True)
    scheduler = WeDLMScheduler(model, config, max_batch_size=2)
    requests = requests_of([LONG_PROMPTS[0], PROMPTS[2]], [12, 200])
    pool, width, most, forward = scheduler.batch.pool, 2 * WINDOW, [], PoolBackend.forward

    def counted_forward(backend, *args):
        logits = forward(backend, *args)
        most.append(sum(map(len, backend.cache.blocks.held)))
        assert backend.cache.blocks.capacity <= max(most) + -(-max(most) // SPARE)
        return logits

    def sizes(s):
        for held, end in zip(pool.cache.blocks.held, pool.ends):
            assert blocks_for(end, 4) <= len(held) <= blocks_for(end + 2 * width, 4)

    monkeypatch.setattr(PoolBackend, "forward", counted_forward)
    results = run_staggered(scheduler, requests, [0, 2], sizes)
    assert_alone_equal(model, config, requests, results)
    assert max(most) > 2 * blocks_for(len(LONG_PROMPTS[0]), 4), "the rows grew over several blocks"


@pytest.mark.parametrize("block_size", [4, 16])
@pytest.mark.parametrize("wedlm", [{}, {"wedlm_lossless": True}], ids=str)
def test_a_row_reads_only_its_own_blocks(monkeypatch, block_size, wedlm):
    """Each forward is run again for each row with every slot outside that row's blocks (other rows', free ones)
    set to NaN: the row's logits are bit for bit the same, so its attention read nothing else (a masked read
    would bring the NaN in: 0 x NaN), while the other rows' turn NaN (the poison reached what they read). The
    positions each row reads stop at the longest running row's, never a budget."""
    monkeypatch.setattr(pool_module, "BLOCK_SIZE", block_size)
    model = wedlm_hf.enable(tiny_model("wedlm"))
    config = server_config(model, **wedlm)
    scheduler = WeDLMScheduler(model, config, max_batch_size=3)
    forward, checked, widths = PoolBackend.forward, [], []

    def poisoned_forward(backend, *args):
        logits = forward(backend, *args)  # (a run again writes the same window K/V at the same slots)
        tensors = [t for layer in backend.cache.layers for t in (layer.keys, layer.values)]
        after = [t.clone() for t in tensors]
        rows, blocks = logits.shape[0], backend.cache.blocks
        widths.append((backend.cache.read_slots.numel() // rows, max(backend.ends) + args[0].shape[1]))
        for row in range(rows):
            outside = torch.ones(blocks.capacity * blocks.block_size, dtype=torch.bool)
            outside[block_slots(backend, blocks.held[row])] = False
            for tensor, saved in zip(tensors, after):
                tensor.copy_(saved.masked_fill(outside[:, None, None], float("nan")))
            poisoned = forward(backend, *args)
            others = [other for other in range(rows) if other != row]
            checked.append((rows, torch.equal(poisoned[row], logits[row]), all(
                not poisoned[other].isfinite().all() for other in others)))
        for tensor, saved in zip(tensors, after):
            tensor.copy_(saved)
        return logits

    monkeypatch.setattr(PoolBackend, "forward", poisoned_forward)
    requests = requests_of(LONG_PROMPTS, BUDGETS)
    assert_alone_equal(model, config, requests, run_staggered(scheduler, requests, ARRIVALS))
    assert all(same for _, same, _ in checked), "a row read outside its blocks"
    assert all(poisoned for _, _, poisoned in checked), "the poison did not reach the other rows"
    assert max(rows for rows, *_ in checked) == 3
    assert all(read == longest for read, longest in widths), "a forward read past the longest running row"


@pytest.mark.parametrize(
    "kv_pool, builder",
    [
        (None, (PoolBackend, "joined_rows")),
        (None, (LosslessPolicy, "joined_rows")),
        (None, (OutputRecord, "joined")),
        (False, (WeDLMCache, "joined")),
    ],
    ids=["pool", "policy", "record", "growing-cache"],
)
def test_a_fault_while_joining_fails_only_the_joining_request(monkeypatch, kv_pool, builder):
    """A fault (a simulated out-of-memory) in one part of a join, after the parts before it were built: the request
    being admitted fails with it; the running request, and one admitted after the fault, decode as alone."""
    model = wedlm_hf.enable(tiny_model("wedlm"))
    config = server_config(model, wedlm_lossless=True)
    scheduler = WeDLMScheduler(model, config, max_batch_size=3, kv_pool=kv_pool)
    owner, name = builder
    original, calls = getattr(owner, name), []

    def failing_once(self, other):
        updates = original(self, other)
        calls.append(self)
        if scheduler.batch.loop is not None and len(calls) == 1 + (owner is PoolBackend):
            raise MemoryError("simulated: out of memory while joining")
        return updates

    monkeypatch.setattr(owner, name, failing_once)
    requests = requests_of(PROMPTS[:3], [24, 10, 10])
    results = run_staggered(scheduler, requests, [0, 2, 4])
    assert results["1"].finish_reason == "error" and "out of memory while joining" in results["1"].error
    assert_alone_equal(model, config, [requests[0], requests[2]], results)


def test_records_are_as_wide_as_the_budgets_of_their_rows():
    model = wedlm_hf.enable(tiny_model("wedlm"))
    scheduler = WeDLMScheduler(model, server_config(model), max_batch_size=3)
    widths = []

    def record_width(s):
        if s.batch.loop is not None:
            record = s.batch.loop.record
            held = [state.request for state in s.running]
            widths.append((record.sequences.shape[1] - record.prompt_length, max(r.max_new_tokens for r in held)))

    run_staggered(scheduler, requests_of([[5, 6, 7], [8, 9]], [8, 30]), [0, 1], record_width)
    assert widths and all(outputs == budget + 1 for outputs, budget in widths)
    assert {budget for _, budget in widths} == {8, 30}


def test_the_pool_or_not_by_attention_implementation():
    """Eager attention takes the pool's additive mask; the growing cache decodes as alone too; an implementation
    without 4D masks runs without the pool, and asking it for one names `kv_pool`."""
    for family, attn, kv_pool in (("qwen3", "eager", None), ("wedlm", "sdpa", False)):
        model = wedlm_hf.enable(tiny_model(family, attn=attn))
        config = server_config(model)
        scheduler = WeDLMScheduler(model, config, max_batch_size=3, kv_pool=kv_pool)
        assert (scheduler.batch.pool is None) == (kv_pool is False)
        requests = requests_of(PROMPTS, BUDGETS)
        assert_alone_equal(model, config, requests, run_staggered(scheduler, requests, ARRIVALS))
    model.config._attn_implementation = "flash_attention_2"
    assert WeDLMScheduler(model, config).batch.pool is None
    with pytest.raises(ValueError, match="kv_pool=False"):
        WeDLMScheduler(model, config, kv_pool=True)
    with pytest.raises(ValueError, match="`kv_pool` must be"):
        WeDLMScheduler(model, config, kv_pool="yes")


def test_each_request_record_holds_its_row_and_blocks(monkeypatch):
    """A running request's record (`Sequence`) names its row of the running batch and the pool's blocks of that row,
    kept up to date as rows before it leave and as its row grows; every running row is one request's."""
    monkeypatch.setattr(pool_module, "BLOCK_SIZE", 4)
    model = wedlm_hf.enable(tiny_model("wedlm"))
    config = server_config(model, wedlm_lossless=True)
    scheduler = WeDLMScheduler(model, config, max_batch_size=3)
    checked = []

    def records_match_rows(s):
        if s.batch.loop is None:
            return
        rows, held = s.batch.loop.rows, s.batch.pool.cache.blocks.held
        assert [sequence.row for sequence in s.running] == list(range(rows.held))
        for running_row, row in enumerate(rows.input_rows):
            sequence = s.running.sequences[row]
            assert sequence.finish_reason == "" and sequence.blocks is held[running_row]
            checked.append(len(sequence.blocks))

    requests = requests_of(LONG_PROMPTS, BUDGETS)
    assert_alone_equal(model, config, requests, run_staggered(scheduler, requests, ARRIVALS, records_match_rows))
    assert max(checked) > 1 and len(checked) > len(requests)
