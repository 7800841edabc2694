"""Continuous batching (wedlm_hf.continuous): requests joining a running batch at staggered steps decode exactly
what a `generate` call of their own decodes (tokens and statistics), greedy and lossless; faults stay with their
request; every request gets exactly one final update."""

import copy
import threading

import pytest
import torch
from transformers import AutoTokenizer, GenerationConfig
from patience import PATIENCE_S

import wedlm_hf
from real_model import load_smollm2
from tiny_models import EOS_ID, MASK_ID, tiny_model
from wedlm_hf.continuous import GenerationRequest, WeDLMScheduler
from wedlm_hf.continuous.manager import ContinuousBatcher

WINDOW = 4
PROMPTS = [[5, 6, 7, 8, 9], [10, 11, 12], [20, 21, 22, 23, 24, 25, 26, 27, 28], [30, 31], [40, 41, 42, 43], [50]]
BUDGETS = [12, 7, 20, 9, 16, 5]
ARRIVALS = [0, 1, 1, 4, 5, 5]
"""The scheduler step at which each request arrives (requests 3.. wait for a slot at max_batch_size=3)."""
STATS = ("forwards", "generated", "processed", "fill_steps", "commit_steps", "drafted", "accepted", "corrected")


def with_options(config: GenerationConfig, **options) -> GenerationConfig:
    config = copy.deepcopy(config)
    for name, value in options.items():
        setattr(config, name, value)
    return config


def server_config(model, **wedlm) -> GenerationConfig:
    return with_options(model.generation_config, mask_token_id=MASK_ID, wedlm_window_size=WINDOW, **wedlm)


def lone_generate(model, prompt, budget, config, **options):
    output = model.generate(
        input_ids=torch.tensor([prompt]), generation_config=config, max_new_tokens=budget, decoding="wedlm",
        return_dict_in_generate=True, **options,
    )
    stats = output.wedlm_stats
    return output.sequences[0, len(prompt) : len(prompt) + stats.generated[0]].tolist(), stats


def run_staggered(scheduler, requests, arrivals, check_step=None):
    """Add each request at its arrival step, step until all ended; the final update of each request, by id."""
    results, step, pending = {}, 0, list(range(len(requests)))
    while pending or scheduler.has_work():
        for i in [i for i in pending if arrivals[i] <= step]:
            scheduler.add(requests[i])
            pending.remove(i)
        for update in scheduler.step():
            assert update.request_id not in results, "an update after the request's final one"
            if update.finished:
                results[update.request_id] = update.result
        if check_step is not None:
            check_step(scheduler)
        step += 1
        assert step < 500
    return results


def assert_alone_equal(model, config, requests, results, **options):
    """Each request decodes the tokens of a `generate` call of its own, with its statistics, but where lossless
    mode's adaptive schedule prices the draft width per batch (draft_schedule.py): there its forwards and drafts
    follow the batch it ran in, and only its tokens are its own."""
    priced = getattr(config, "wedlm_lossless", False) and getattr(config, "wedlm_draft_schedule", None) != "full"
    for request in requests:
        tokens, stats = lone_generate(model, request.input_ids, request.max_new_tokens, config, **options)
        result = results[request.request_id]
        assert result.error is None and result.tokens == tokens, request.request_id
        for name in ("generated",) if priced else STATS:
            assert getattr(result.stats, name) == getattr(stats, name), (request.request_id, name)
        if not priced:
            assert result.stats.model_calls == stats.forwards[0]


@pytest.mark.parametrize("family", ["wedlm", "llama"])
@pytest.mark.parametrize(
    "wedlm",
    [
        {}, {"wedlm_lossless": True}, {"wedlm_lossless": True, "wedlm_draft_schedule": "full"},
        {"wedlm_lossless": True, "wedlm_prompt_lookup": True},
        {"wedlm_entropy_threshold": None},
    ],
    ids=str,
)
def test_staggered_requests_decode_as_alone(family, wedlm):
    model = wedlm_hf.enable(tiny_model(family))
    config = server_config(model, **wedlm)
    scheduler = WeDLMScheduler(model, config, max_batch_size=3)
    requests = [GenerationRequest(p, b, request_id=str(i)) for i, (p, b) in enumerate(zip(PROMPTS, BUDGETS))]
    sizes = []

    def holds_only_the_running_requests(s):
        sizes.append(len(s.running))
        loop = s.batch.loop
        if not s.running:  # no batch is kept (or built) for requests that are not there
            assert loop is None
            return
        record = loop.record
        assert record.sequences.shape[0] == loop.running == len(s.running)  # no row beyond a running request
        assert record.prompt_length <= max(len(p) for p in PROMPTS)  # prompt columns as wide as real prompts

    results = run_staggered(scheduler, requests, ARRIVALS, holds_only_the_running_requests)
    assert max(sizes) == 3 and len(results) == len(requests)  # batches really formed, and capped
    assert scheduler.batch.loop is None
    assert_alone_equal(model, config, requests, results)
    if wedlm.get("wedlm_lossless"):  # lossless: also exactly greedy AR
        for request in requests:
            greedy = model.generate(input_ids=torch.tensor([request.input_ids]), max_new_tokens=request.max_new_tokens)
            assert results[request.request_id].tokens == greedy[0, len(request.input_ids) :].tolist()


class ShortestFirst:
    """An admission policy other than the default: the queued request that reserves the fewest tokens first."""

    def __init__(self):
        self.admitted = []

    def admit(self, queue, free_rows, running):
        chosen = sorted(queue, key=lambda request: request.reserved_tokens)[:free_rows]
        for request in chosen:
            queue.remove(request)
        self.admitted += [request.request_id for request in chosen]
        return chosen


def test_admission_is_a_replaceable_policy():
    model = wedlm_hf.enable(tiny_model("wedlm"))
    config = server_config(model)
    policy = ShortestFirst()
    scheduler = WeDLMScheduler(model, config, max_batch_size=2, admission=policy)
    requests = [GenerationRequest(p, b, request_id=str(i)) for i, (p, b) in enumerate(zip(PROMPTS, BUDGETS))]
    results = run_staggered(scheduler, requests, [0] * len(requests))
    first = sorted(requests, key=lambda request: request.reserved_tokens)[:2]
    assert policy.admitted[:2] == [request.request_id for request in first]
    assert sorted(policy.admitted) == sorted(results) == sorted(request.request_id for request in requests)
    assert_alone_equal(model, config, requests, results)


def test_rows_ending_on_eos_leave_and_report_eos():
    model = wedlm_hf.enable(tiny_model("wedlm"))
    config = server_config(model)
    common = lone_generate(model, PROMPTS[0], 8, config)[0][3]  # a token random outputs meet: EOS for this test
    config.eos_token_id = [EOS_ID, common]
    scheduler = WeDLMScheduler(model, config, max_batch_size=4)
    prompts = [[3 + i, 60 - i, 7] for i in range(10)] + PROMPTS
    requests = [GenerationRequest(p, 30, request_id=str(i)) for i, p in enumerate(prompts)]
    results = run_staggered(scheduler, requests, [i // 2 for i in range(len(prompts))])
    assert_alone_equal(model, config, requests, results)
    ended_on_eos = [r for r in results.values() if r.tokens[-1] in (EOS_ID, common)]
    assert ended_on_eos and all(r.finish_reason == "eos" and len(r.tokens) < 30 for r in ended_on_eos)
    assert any(r.finish_reason == "length" for r in results.values())


def test_token_budget_and_queue_bound_the_batch():
    model = wedlm_hf.enable(tiny_model("wedlm"))
    config = server_config(model)
    scheduler = WeDLMScheduler(model, config, max_batch_size=8, max_batch_tokens=40)
    requests = [GenerationRequest(p, b, request_id=str(i)) for i, (p, b) in enumerate(zip(PROMPTS, BUDGETS))]

    def within_budget(s):
        held = [state.request for state in s.running]
        assert sum(len(r.input_ids) + r.max_new_tokens for r in held) <= 40

    results = run_staggered(scheduler, requests, [0] * len(requests), within_budget)
    assert_alone_equal(model, config, requests, results)
    with pytest.raises(ValueError, match="token budget"):
        scheduler.add(GenerationRequest([5] * 10, 31))


def test_cancelled_request_leaves_and_the_others_finish_unchanged():
    model = wedlm_hf.enable(tiny_model("wedlm"))
    config = server_config(model, wedlm_lossless=True)
    scheduler = WeDLMScheduler(model, config, max_batch_size=4)
    requests = [GenerationRequest(p, 24, request_id=str(i)) for i, p in enumerate(PROMPTS[:4])]
    for request in requests:
        scheduler.add(request)
    results, streamed = {}, {}
    for step in range(100):
        if step == 2:
            scheduler.cancel("1")
            scheduler.cancel("queued-never")  # unknown ids are ignored
        for update in scheduler.step():
            streamed.setdefault(update.request_id, []).extend(update.new_tokens)
            if update.finished:
                results[update.request_id] = update.result
        if step == 2:
            assert len(scheduler.running) == 3  # its row left at the step boundary
        if not scheduler.has_work():
            break
    assert results["1"].finish_reason == "cancelled" and 0 < len(results["1"].tokens) < 24
    others = [r for r in requests if r.request_id != "1"]
    assert_alone_equal(model, config, others, results)
    assert all(streamed[r.request_id] == results[r.request_id].tokens for r in requests)  # streams are complete


def test_a_fault_in_one_requests_first_step_fails_it_alone():
    model = wedlm_hf.enable(tiny_model("wedlm"))
    config = server_config(model)
    poison = 77

    def fault(module, args, kwargs):
        if (kwargs["input_ids"] == poison).any():
            raise RuntimeError("injected fault")

    hook = model.register_forward_pre_hook(fault, with_kwargs=True)
    try:
        scheduler = WeDLMScheduler(model, config, max_batch_size=4)
        requests = [GenerationRequest(p, 10, request_id=str(i)) for i, p in enumerate(PROMPTS[:3])]
        requests.append(GenerationRequest([5, poison, 6], 10, request_id="poisoned"))
        results = run_staggered(scheduler, requests, [0, 1, 1, 1])
    finally:
        hook.remove()
    assert results["poisoned"].finish_reason == "error" and "injected fault" in results["poisoned"].error
    assert_alone_equal(model, config, requests[:3], results)


def test_malformed_requests_are_refused_with_the_reason():
    model = wedlm_hf.enable(tiny_model("wedlm"))
    scheduler = WeDLMScheduler(model, server_config(model))
    for request, reason in [
        (GenerationRequest([], 4), "prompt is empty"),
        (GenerationRequest([5, 6], 0), "max_new_tokens"),
        (GenerationRequest([5, 6], 511), "max_position_embeddings"),
        (GenerationRequest([5, 10_000], 4), "token ids"),
        (GenerationRequest([5, 6], 4, stop_strings=["x"]), "tokenizer"),
    ]:
        with pytest.raises(ValueError, match=reason):
            scheduler.add(request)
    scheduler.add(GenerationRequest([5, 6], 4, request_id="a"))
    with pytest.raises(ValueError, match="already queued"):
        scheduler.add(GenerationRequest([7, 8], 4, request_id="a"))
    with pytest.raises(ValueError, match="wedlm_static"):
        WeDLMScheduler(model, server_config(model, wedlm_static=True))


def test_per_request_stop_strings_match_generate():
    model = wedlm_hf.enable(wedlm_hf.WeDLMForCausalLM.from_pretrained(wedlm_hf.DEFAULT_MODEL).eval())
    tokenizer = AutoTokenizer.from_pretrained(wedlm_hf.DEFAULT_MODEL)
    config = model.generation_config
    scheduler = WeDLMScheduler(model, config, max_batch_size=4, tokenizer=tokenizer)
    prompts = ["1, 2, 3, 4,", "10, 11, 12,", "def add(a, b):"]
    stops = [[" 9,"], None, ["\n"]]
    requests = [
        GenerationRequest(tokenizer(p)["input_ids"], 40, s, request_id=str(i))
        for i, (p, s) in enumerate(zip(prompts, stops))
    ]
    results = run_staggered(scheduler, requests, [0, 1, 2])
    for request, stop in zip(requests, stops):
        options = {"stop_strings": stop, "tokenizer": tokenizer} if stop else {}
        tokens, _ = lone_generate(model, request.input_ids, 40, config, **options)
        assert results[request.request_id].tokens == tokens
    assert results["0"].finish_reason == "stop" and tokenizer.decode(results["0"].tokens).endswith(" 9,")


def test_batcher_serves_concurrent_submitters_and_streams():
    model = wedlm_hf.enable(tiny_model("wedlm"))
    config = server_config(model, wedlm_lossless=True)
    with ContinuousBatcher(model, config, max_batch_size=3) as batcher:
        handles, streams = [None] * len(PROMPTS), [[] for _ in PROMPTS]

        def client(i):
            handles[i] = batcher.submit(PROMPTS[i], BUDGETS[i], request_id=str(i))
            for tokens in handles[i].stream(timeout=PATIENCE_S):
                streams[i].extend(tokens)

        threads = [threading.Thread(target=client, args=(i,)) for i in range(len(PROMPTS))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        results = {str(i): handle.result(timeout=PATIENCE_S) for i, handle in enumerate(handles)}
        requests = [GenerationRequest(p, b, request_id=str(i)) for i, (p, b) in enumerate(zip(PROMPTS, BUDGETS))]
        assert_alone_equal(model, config, requests, results)
        assert streams == [results[str(i)].tokens for i in range(len(PROMPTS))]
        batch_job = batcher.generate(PROMPTS[:2], 6)  # results in the prompts' order
        assert [r.tokens for r in batch_job] == [lone_generate(model, p, 6, config)[0] for p in PROMPTS[:2]]
        with pytest.raises(ValueError, match="prompt is empty"):
            batcher.submit([], 4)
    assert not batcher.is_alive()


def test_smollm2_lossless_staggered_requests_equal_greedy():
    model, tokenizer = load_smollm2(torch.float32)
    model = wedlm_hf.enable(model)
    config = with_options(
        model.generation_config, decoding="wedlm", wedlm_lossless=True, mask_token_id=16, do_sample=False
    )
    texts = ["The capital of France is", "def fibonacci(n):", "1, 2, 3, 4, 5,", "Once upon a time, there was a"]
    requests = [
        GenerationRequest(tokenizer(t, add_special_tokens=False)["input_ids"], 10, request_id=str(i))
        for i, t in enumerate(texts)
    ]
    results = run_staggered(WeDLMScheduler(model, config, max_batch_size=3), requests, [0, 1, 3, 3])
    for request in requests:
        greedy = model.generate(
            input_ids=torch.tensor([request.input_ids]), max_new_tokens=10, do_sample=False, decoding="ar"
        )
        assert results[request.request_id].tokens == greedy[0, len(request.input_ids) :].tolist()
    assert all(r.stats.accepted is not None for r in results.values())


def test_lossless_sampling_never_draws_the_mask_id():
    """The mask id marks empty slots: lossless sampling suppresses it in continuous batching as `generate` does,
    even for a model that gives it a third of the probability."""
    model = tiny_model("wedlm", seed=3, peak=1.0)
    head = torch.nn.Linear(64, 96, bias=True)
    with torch.no_grad():
        head.weight.zero_()
        head.bias.zero_()
        head.bias[MASK_ID] = 4.0  # e^4 / (e^4 + 95): about 36% of the mass
        head.bias[EOS_ID] = -1e4
    model.lm_head = head
    model = wedlm_hf.enable(model)
    config = server_config(model, wedlm_lossless=True, do_sample=True)
    scheduler = WeDLMScheduler(model, config, max_batch_size=3)
    requests = [GenerationRequest(p, 16, request_id=str(i)) for i, p in enumerate(PROMPTS)]
    torch.manual_seed(0)
    results = run_staggered(scheduler, requests, ARRIVALS)
    drawn = [token for result in results.values() for token in result.tokens]
    assert len(drawn) == 16 * len(PROMPTS) and MASK_ID not in drawn


def mask_after(model, position: int):
    """A forward hook making the mask token the model's greedy next token after `position`, in any row there."""

    def hook(module, args, kwargs, output):
        logits = output.logits
        positions = kwargs["position_ids"][:, -logits.shape[1] :]
        logits[..., MASK_ID] = torch.where(positions == position, 1e4, logits[..., MASK_ID])
        return output

    return model.register_forward_hook(hook, with_kwargs=True)


def test_a_row_whose_greedy_token_is_the_mask_fails_alone():
    """Lossless greedy decoding cannot go on in a row that predicts the mask token: that request fails with the
    reason, the rows decoding beside it (never reaching that position) and later requests decode as alone."""
    model = wedlm_hf.enable(tiny_model("wedlm"))
    config = server_config(model, wedlm_lossless=True)
    requests = [
        GenerationRequest(PROMPTS[0], 20, request_id="reaches"),  # positions 5..24: its token after 12 is the mask
        GenerationRequest(PROMPTS[1], 7, request_id="short"),
        GenerationRequest(PROMPTS[3], 9, request_id="later"),
    ]
    hook = mask_after(model, 12)
    try:
        with pytest.raises(ValueError, match="mask token"):  # one `generate` call fails as a whole
            lone_generate(model, PROMPTS[0], 20, config)
        results = run_staggered(WeDLMScheduler(model, config, max_batch_size=3), requests, [0, 1, 6])
        failed = results["reaches"]
        assert failed.finish_reason == "error" and "greedy next token is the mask token" in failed.error
        assert_alone_equal(model, config, requests[1:], results)
    finally:
        hook.remove()


class EngineKilled(BaseException):
    """A fault no step catches, as KeyboardInterrupt or SystemExit would be."""


def test_pending_requests_fail_when_the_decoding_thread_dies():
    model = wedlm_hf.enable(tiny_model("wedlm"))
    poison = 77

    def fault(module, args, kwargs):
        if (kwargs["input_ids"] == poison).any():
            raise EngineKilled("injected engine death")

    hook = model.register_forward_pre_hook(fault, with_kwargs=True)
    try:
        with ContinuousBatcher(model, server_config(model), max_batch_size=2) as batcher:
            running = batcher.submit(PROMPTS[0], 400)
            killer = batcher.submit([5, poison, 6], 10)
            queued = batcher.submit(PROMPTS[1], 10)  # the batch is full: it waits
            results = [handle.result(timeout=PATIENCE_S) for handle in (running, killer, queued)]
            assert not batcher.is_alive()
            with pytest.raises(RuntimeError, match="stopped.*EngineKilled: injected engine death"):
                batcher.submit(PROMPTS[1], 4)
    finally:
        hook.remove()
    for result in results:
        assert result.finish_reason == "error"
        assert "engine stopped (EngineKilled: injected engine death)" in result.error
