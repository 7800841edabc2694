"""Continuous batching's K/V pool (generation/pool.py) and transactional joins (`DecodeLoop.join`): admitting a
request writes only its own pool row and exiting moves at most one running row into the row it frees, so forwards
feed the running rows alone; a freed row is taken again, lowest first; a fault while a request joins fails that
request alone; a request's record is as wide as its budget. Every request still decodes what a `generate` call of
its own decodes."""

import pytest
import torch
from test_continuous_batching import (
    ARRIVALS, BUDGETS, PROMPTS, WINDOW, assert_alone_equal, run_staggered, server_config,
)
from tiny_models import tiny_model

import wedlm_hf
from wedlm_hf.continuous import GenerationRequest, WeDLMScheduler
from wedlm_hf.continuous.batch import RunningBatch
from wedlm_hf.generation.cache import WeDLMCache
from wedlm_hf.generation.lossless import LosslessPolicy
from wedlm_hf.generation.kv_pool import KVPool
from wedlm_hf.generation.pool import GROWTH, GROWTH_COLUMNS, PoolBackend
from wedlm_hf.generation.record import OutputRecord
from wedlm_hf.generation.transformers_version import CACHE_KEYWORD


def requests_of(prompts, budgets):
    return [GenerationRequest(p, b, request_id=str(i)) for i, (p, b) in enumerate(zip(prompts, budgets))]


def pool_tensors(scheduler) -> list[torch.Tensor]:
    return [tensor for layer in scheduler.batch.pool.cache.layers for tensor in (layer.keys, layer.values)]


@pytest.mark.parametrize("wedlm", [{}, {"wedlm_lossless": True}], ids=str)
def test_admission_writes_only_the_new_rows_and_exit_moves_at_most_one_row_each(monkeypatch, wedlm):
    """Across every admission and exit the pool's K/V stay the same tensors; an admission changes no byte outside
    the pool rows it hands out (the lowest free ones); an exit moves at most one running row per row that left,
    into a freed row, so the running rows always hold the first pool rows and every forward feeds them alone."""
    model = wedlm_hf.enable(tiny_model("wedlm"))
    config = server_config(model, **wedlm)
    scheduler = WeDLMScheduler(model, config, max_batch_size=3, max_sequence_length=64)
    pool = scheduler.batch.pool
    monkeypatch.setattr(WeDLMCache, "joined", None)  # the growing cache's concatenation is never reached
    admissions, exits, fed_rows = [], [], []
    start, select_rows = RunningBatch.start, PoolBackend.select_rows

    def watched_start(batch, group):  # records what it sees (an exception here would fail the request)
        before = [t.clone() for t in pool_tensors(scheduler)] if pool.cache.end is not None else None
        held, free = list(pool.pool_rows), [row for row in range(3) if row not in pool.pool_rows]
        start(batch, group)
        new = pool.pool_rows[len(held) :]
        admissions.append((new, pool.pool_rows[: len(held)] == held, new == free[: len(new)], changed(before, new)))

    def watched_select_rows(backend, index, kept):
        before, leaving = [t.clone() for t in pool_tensors(scheduler)], len(backend.pool_rows) - len(kept)
        select_rows(backend, index, kept)
        freed = [row for row in range(3) if row not in backend.pool_rows]
        moved = [row for row in range(3) if changed(before, [r for r in range(3) if r != row])]
        exits.append((all(row not in freed for row in moved) and len(moved) <= leaving, backend.pool_rows, moved))

    def changed(before, written) -> bool:
        untouched = [row for row in range(3) if row not in written]
        return before is not None and any(
            not torch.equal(old[untouched], now[untouched]) for old, now in zip(before, pool_tensors(scheduler))
        )

    def count_fed_rows(_, args, kwargs):
        if isinstance(kwargs.get(CACHE_KEYWORD), KVPool):
            fed_rows.append((kwargs["input_ids"].shape[0], len(pool.pool_rows)))

    monkeypatch.setattr(RunningBatch, "start", watched_start)
    monkeypatch.setattr(PoolBackend, "select_rows", watched_select_rows)
    model.register_forward_pre_hook(count_fed_rows, with_kwargs=True)
    pointers = []

    def same_tensors(s):
        if s.batch.pool.cache.end is not None:
            pointers.append([t.data_ptr() for t in pool_tensors(s)])

    requests = requests_of(PROMPTS, BUDGETS)
    results = run_staggered(scheduler, requests, ARRIVALS, same_tensors)
    assert_alone_equal(model, config, requests, results)
    assert len(admissions) >= 4 and all(p == pointers[0] for p in pointers)
    assert all(held_stay for _, held_stay, _, _ in admissions)
    assert all(lowest_free for _, _, lowest_free, _ in admissions)
    assert not any(changed for *_, changed in admissions), "an admission wrote outside the pool rows it took"
    taken = [set(rows) for rows, *_ in admissions]
    assert any(later & set().union(*taken[:i]) for i, later in enumerate(taken)), "freed pool rows are taken again"
    assert all(moves_at_most_one for moves_at_most_one, *_ in exits), "an exit moved more than it freed"
    assert any(moved for *_, moved in exits), "no exit below a running row"
    assert all(sorted(rows) == list(range(len(rows))) for _, rows, _ in exits), "the running rows hold a pool prefix"
    assert fed_rows and all(fed == running for fed, running in fed_rows), "a forward fed rows that are not running"
    assert any(running < 3 for _, running in fed_rows)
    assert pool.pool_rows == []


def test_a_growing_pool_follows_its_longest_row_and_decodes_as_alone():
    """Without `max_sequence_length` the pool grows with its longest running row, by a quarter at a time, while
    other rows run; not by a request's budget (a request may run to the position limit)."""
    model = wedlm_hf.enable(tiny_model("llama"))
    config = server_config(model, wedlm_lossless=True)
    scheduler = WeDLMScheduler(model, config, max_batch_size=2)
    requests = requests_of([PROMPTS[1], PROMPTS[2]], [12, 200])
    columns, longest = [], []

    def sizes(s):
        columns.append(s.batch.pool.cache.max_cache_len)
        longest.append(max([len(state.request.input_ids) + len(state.tokens) for state in s.running], default=0))

    results = run_staggered(scheduler, requests, [0, 2], sizes)
    assert_alone_equal(model, config, requests, results)
    assert columns[0] == GROWTH_COLUMNS < columns[-1] and columns == sorted(columns)
    width = 2 * WINDOW  # a forward's widest window
    assert max(longest) <= columns[-1] <= GROWTH * (max(longest) + width) + GROWTH_COLUMNS
    assert 1 < len(set(columns)) <= 6, "the pool grows a few times per doubling of its longest row"


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
