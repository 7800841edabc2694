"""`wedlm-hf serve --continuous-batching` on 127.0.0.1: concurrent requests are decoded together and each gets
what a lone `generate` gives it; disconnects, malformed requests and decoding faults stay with their request."""

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
import transformers
from patience import PATIENCE_S

import wedlm_hf
from local_server import start_server

openai = pytest.importorskip("openai", reason="the serve extra is not installed: pip install 'wedlm-hf[serve]'")
httpx = pytest.importorskip("httpx")
pytest.importorskip("wedlm_hf.serving", exc_type=ImportError)  # says which transformers it needs

MODEL = wedlm_hf.DEFAULT_MODEL
PROMPTS = ["1, 2, 3, 4,", "10, 11, 12,", "def add(a, b):", "5, 6, 7,", "x = [1, 2,", "20, 21,"]
MAX_TOKENS = [24, 10, 16, 30, 8, 20]
POISON = "zzzz"
"""A prompt the fixture's forward hook fails on (in its first step only: later forwards see window tokens)."""
FAULT = 'injected "decoding" fault'


def started(fault: BaseException, **serve_options) -> "SimpleServer":
    """A continuous-batching server whose model raises `fault` in a forward over `POISON`'s tokens (its first step
    only: later forwards see window tokens)."""
    running, port = start_server(batching={"max_batch_size": 4}, **serve_options)
    (timed_model,) = running._model_manager.loaded_models.values()
    tokenizer = transformers.AutoTokenizer.from_pretrained(MODEL)
    poison_ids = tokenizer(POISON)["input_ids"]

    def fail(module, args, kwargs):
        ids = kwargs["input_ids"]
        if ids.shape[1] >= len(poison_ids):
            if (ids.unfold(1, len(poison_ids), 1) == torch.tensor(poison_ids)).all(-1).any():
                raise fault

    timed_model.model.register_forward_pre_hook(fail, with_kwargs=True)
    base_url = f"http://127.0.0.1:{port}"
    client = openai.OpenAI(base_url=f"{base_url}/v1", api_key="unused", timeout=PATIENCE_S, max_retries=0)
    return SimpleServer(client, base_url, timed_model.model, tokenizer, running)


@pytest.fixture(scope="module")
def server():
    started_server = started(RuntimeError(FAULT))
    yield started_server
    started_server.running.kill_server()


class SimpleServer:
    def __init__(self, client, base_url, model, tokenizer, running):
        self.client, self.base_url, self.model = client, base_url, model
        self.tokenizer, self.running = tokenizer, running

    def running_rows(self) -> int:
        manager = self.running._generation_state._cb_manager
        return len(manager.batcher.scheduler.running) if manager and manager.batcher else 0

    def lone(self, prompt: str, max_tokens: int) -> str:
        inputs = self.tokenizer(prompt, return_tensors="pt")
        output = self.model.generate(**inputs, max_new_tokens=max_tokens)
        return self.tokenizer.decode(output[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True)


def complete(server, prompt, max_tokens, stream):
    if not stream:
        completion = server.client.completions.create(model=MODEL, prompt=prompt, max_tokens=max_tokens)
        return completion.choices[0].text, completion.usage.completion_tokens, completion.choices[0].finish_reason
    chunks = list(server.client.completions.create(model=MODEL, prompt=prompt, max_tokens=max_tokens, stream=True))
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    usage = [c.usage for c in chunks if c.usage is not None]
    assert len(finish) == 1 and len(usage) == 1  # one complete answer
    return text, usage[0].completion_tokens, finish[0]


def test_concurrent_requests_each_get_their_lone_generate_output(server):
    jobs = [(p, m, i % 2 == 0) for i, (p, m) in enumerate(zip(PROMPTS, MAX_TOKENS))] * 2
    sizes, done = [], threading.Event()

    def watch():
        while not done.is_set():
            sizes.append(server.running_rows())
            time.sleep(0.002)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        with ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(lambda job: complete(server, *job), jobs))
    finally:
        done.set()
        watcher.join()
    assert max(sizes) > 1  # requests really shared the batch
    for (prompt, max_tokens, _), (text, tokens, finish) in zip(jobs, answers):
        assert text == server.lone(prompt, max_tokens)
        assert (tokens == max_tokens) == (finish == "length")


def test_streamed_chat_is_served(server):
    chunks = list(
        server.client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "1, 2, 3,"}], max_tokens=12, stream=True
        )
    )
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["length"]


def test_client_disconnecting_mid_stream_frees_its_row(server):
    with ThreadPoolExecutor(1) as pool:
        other = pool.submit(complete, server, PROMPTS[0], 60, False)
        with httpx.Client(timeout=PATIENCE_S) as http:
            body = {"model": MODEL, "prompt": PROMPTS[3], "max_tokens": 500, "stream": True}
            with http.stream("POST", f"{server.base_url}/v1/completions", json=body) as response:
                next(response.iter_lines())  # the first chunk came: the request is decoding
        deadline = time.monotonic() + PATIENCE_S
        while server.running_rows() > (0 if other.done() else 1):
            assert time.monotonic() < deadline, "the disconnected request kept its row"
            time.sleep(0.05)
        text, _, _ = other.result(timeout=PATIENCE_S)
    assert text == server.lone(PROMPTS[0], 60)


@pytest.mark.parametrize(
    "body, status, reason",
    [
        ('{"model": "m", "prompt": ', 422, ""),
        ({"model": "some/other-model", "prompt": "1, 2,"}, 400, "pinned"),
        ({"model": MODEL, "prompt": "1, 2,", "max_tokens": 5000}, 400, "max_position_embeddings"),
        ({"model": MODEL, "prompt": "", "max_tokens": 5}, 400, "prompt is empty"),
        ({"model": MODEL, "prompt": "1, 2,", "frequency_penalty": 2.5, "stream": True}, 400, "frequency_penalty"),
        ({"model": MODEL, "prompt": "1, 2,", "generation_config": '{"decoding": "ar"}'}, 400, "decoding"),
    ],
    ids=["bad-json", "unknown-model", "past-position-limit", "empty-prompt", "penalty-out-of-range", "per-request-ar"],
)
def test_malformed_requests_get_a_clear_4xx_and_the_server_keeps_serving(server, body, status, reason):
    with httpx.Client(timeout=PATIENCE_S) as http:
        send = {"content": body, "headers": {"content-type": "application/json"}} if isinstance(body, str) else {}
        response = http.post(f"{server.base_url}/v1/completions", **(send or {"json": body}))
    error = response.json()["error"]  # OpenAI's shape
    assert response.status_code == status and reason in error["message"] and error["type"] == "invalid_request_error"
    assert complete(server, PROMPTS[1], 6, False)[0] == server.lone(PROMPTS[1], 6)


def test_a_request_failing_inside_decoding_fails_alone(server):
    jobs = [(PROMPTS[0], 20, False), (POISON, 10, False), (PROMPTS[2], 12, True), (POISON, 10, True)]

    def attempt(job):
        try:
            return complete(server, *job)
        except (openai.InternalServerError, openai.APIError) as error:
            return error

    with ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(attempt, jobs))
    assert isinstance(answers[1], openai.InternalServerError) and FAULT in str(answers[1])
    assert isinstance(answers[3], openai.APIError) and FAULT in str(answers[3])  # the streamed event is valid JSON
    for (prompt, max_tokens, _), answer in zip(jobs[::2], answers[::2]):
        assert answer[0] == server.lone(prompt, max_tokens)
    assert complete(server, PROMPTS[1], 6, True)[0] == server.lone(PROMPTS[1], 6)


def test_each_request_samples_with_its_own_settings(server):
    """OpenAI's meaning per request, beside greedy requests: temperature above 0 samples (seeds 1, 2, 3 differ),
    a seed gives the same text whatever else is decoding, top_k / min_p / penalties are accepted, and the greedy
    requests beside them still get their lone text."""
    def sampled(seed, **fields):
        return complete_with(server, PROMPTS[2], 16, temperature=1.5, seed=seed, **fields)

    jobs = [
        lambda: sampled(1), lambda: sampled(2), lambda: sampled(3), lambda: complete(server, PROMPTS[0], 12, False),
        lambda: sampled(1, extra_body={"top_k": 5, "min_p": 0.05, "repetition_penalty": 1.2}),
        lambda: sampled(2, frequency_penalty=0.5, presence_penalty=0.5),
        lambda: complete(server, PROMPTS[1], 8, False),
    ]
    with ThreadPoolExecutor(len(jobs)) as pool:
        answers = [future.result() for future in [pool.submit(job) for job in jobs]]
    assert len({answers[0], answers[1], answers[2]}) > 1, "temperature 1.5 sampled nothing"
    assert answers[0] == sampled(1), "a seeded request's text depends on what ran beside it"
    assert answers[4] == sampled(1, extra_body={"top_k": 5, "min_p": 0.05, "repetition_penalty": 1.2})
    assert answers[3][0] == server.lone(PROMPTS[0], 12) and answers[6][0] == server.lone(PROMPTS[1], 8)


def complete_with(server, prompt: str, max_tokens: int, **fields) -> str:
    return server.client.completions.create(model=MODEL, prompt=prompt, max_tokens=max_tokens, **fields).choices[0].text


def test_settings_shared_by_the_batch_are_refused_naming_the_field(server):
    """WeDLM settings and processors other than sampling belong to the batch: a request asking for others is
    refused naming the field, never served with the server's."""
    body = {"generation_config": json.dumps({"no_repeat_ngram_size": 3})}
    with pytest.raises(openai.BadRequestError, match="generation_config: with continuous batching") as refused:
        server.client.completions.create(model=MODEL, prompt=PROMPTS[0], max_tokens=6, extra_body=body)
    assert refused.value.param == "generation_config"


def test_max_tokens_is_honoured_at_any_value(server):
    """1,024 is transformers serve's default, and still what the client asked for; omitted, as many as fit."""
    positions = server.model.config.max_position_embeddings
    prompt = "1, 2," * ((positions - 12) // len(server.tokenizer("1, 2,")["input_ids"]))
    prompt_tokens = len(server.tokenizer(prompt)["input_ids"])
    with pytest.raises(openai.BadRequestError, match="max_tokens=1024 exceed") as refused:
        server.client.completions.create(model=MODEL, prompt=prompt, max_tokens=1024)
    assert refused.value.param == "max_tokens"
    completion = server.client.completions.create(model=MODEL, prompt=prompt)
    assert completion.usage.completion_tokens == positions - prompt_tokens
    assert completion.choices[0].finish_reason == "length"


def mask_after(model, position: int):
    """A forward hook making the mask token the model's greedy next token after `position`, in any row there."""
    mask_id = model.generation_config.mask_token_id

    def hook(module, args, kwargs, output):
        positions = kwargs["position_ids"][:, -output.logits.shape[1] :]
        output.logits[..., mask_id] = torch.where(positions == position, 1e4, output.logits[..., mask_id])
        return output

    return model.register_forward_hook(hook, with_kwargs=True)


def test_lossless_request_predicting_the_mask_fails_alone():
    """Lossless greedy decoding cannot go on once the model's greedy token is the mask: that request gets the
    reason (HTTP 500, or an error event), the request decoding beside it is served as alone."""
    lossless = started(RuntimeError(FAULT), generation_defaults={"wedlm_lossless": True})
    hook = mask_after(lossless.model, 30)  # the counting prompts get there, the code prompt (16 tokens) does not
    try:
        with ThreadPoolExecutor(1) as pool:
            beside = pool.submit(complete, lossless, PROMPTS[2], 16, True)
            with pytest.raises(openai.InternalServerError, match="greedy next token is the mask token"):
                complete(lossless, PROMPTS[0], 40, False)
            with pytest.raises(openai.APIError, match="greedy next token is the mask token"):
                complete(lossless, PROMPTS[3], 40, True)
            assert beside.result(timeout=PATIENCE_S)[0] == lossless.lone(PROMPTS[2], 16)
    finally:
        hook.remove()
        lossless.running.kill_server()


class EngineKilled(BaseException):
    """A fault no step catches, as KeyboardInterrupt or SystemExit would be."""


def test_pending_requests_fail_when_the_engine_dies():
    doomed = started(EngineKilled("injected engine death"))
    try:
        with httpx.Client(timeout=PATIENCE_S) as http:
            body = {"model": MODEL, "prompt": PROMPTS[2], "max_tokens": 400, "stream": True}
            with http.stream("POST", f"{doomed.base_url}/v1/completions", json=body) as pending:
                lines = pending.iter_lines()
                next(lines)  # the request is decoding
                with pytest.raises(openai.InternalServerError, match="engine stopped .EngineKilled: injected engine"):
                    complete(doomed, POISON, 10, False)
                events = [line for line in lines if line.startswith("data: ")]
            error = json.loads(events[-1].removeprefix("data: "))["error"]
            assert "engine stopped (EngineKilled: injected engine death)" in error["message"]
            assert http.get(f"{doomed.base_url}/health").status_code == 503
        with pytest.raises(openai.InternalServerError, match="has stopped: EngineKilled") as refused:
            complete(doomed, PROMPTS[1], 6, False)
        assert refused.value.status_code == 503
    finally:
        doomed.running.kill_server()
