"""`wedlm-hf serve --continuous-batching` on 127.0.0.1: concurrent requests are decoded together and each gets
what a lone `generate` gives it; disconnects, malformed requests and decoding faults stay with their request."""

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

MODEL = wedlm_hf.DEFAULT_MODEL
PROMPTS = ["1, 2, 3, 4,", "10, 11, 12,", "def add(a, b):", "5, 6, 7,", "x = [1, 2,", "20, 21,"]
MAX_TOKENS = [24, 10, 16, 30, 8, 20]
POISON = "zzzz"
"""A prompt the fixture's forward hook fails on (in its first step only: later forwards see window tokens)."""


@pytest.fixture(scope="module")
def server():
    running, port = start_server(batching={"max_batch_size": 4})
    (timed_model,) = running._model_manager.loaded_models.values()
    tokenizer = transformers.AutoTokenizer.from_pretrained(MODEL)
    poison_ids = tokenizer(POISON)["input_ids"]

    def fault(module, args, kwargs):
        ids = kwargs["input_ids"]
        if ids.shape[1] >= len(poison_ids):
            if (ids.unfold(1, len(poison_ids), 1) == torch.tensor(poison_ids)).all(-1).any():
                raise RuntimeError("injected decoding fault")

    hook = timed_model.model.register_forward_pre_hook(fault, with_kwargs=True)
    base_url = f"http://127.0.0.1:{port}"
    client = openai.OpenAI(base_url=f"{base_url}/v1", api_key="unused", timeout=PATIENCE_S, max_retries=0)
    yield SimpleServer(client, base_url, timed_model.model, tokenizer, running)
    hook.remove()
    running.kill_server()


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
        ({"model": MODEL, "prompt": "1, 2,", "frequency_penalty": 0.5, "stream": True}, 400, "frequency_penalty"),
        ({"model": MODEL, "prompt": "1, 2,", "generation_config": '{"decoding": "ar"}'}, 400, "decoding"),
    ],
    ids=["bad-json", "unknown-model", "past-position-limit", "empty-prompt", "per-request-penalty", "per-request-ar"],
)
def test_malformed_requests_get_a_clear_4xx_and_the_server_keeps_serving(server, body, status, reason):
    with httpx.Client(timeout=PATIENCE_S) as http:
        send = {"content": body, "headers": {"content-type": "application/json"}} if isinstance(body, str) else {}
        response = http.post(f"{server.base_url}/v1/completions", **(send or {"json": body}))
    assert response.status_code == status and reason in response.text
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
    assert isinstance(answers[1], openai.InternalServerError)
    assert isinstance(answers[3], openai.APIError) and "injected decoding fault" in str(answers[3].body)
    for (prompt, max_tokens, _), answer in zip(jobs[::2], answers[::2]):
        assert answer[0] == server.lone(prompt, max_tokens)
    assert complete(server, PROMPTS[1], 6, True)[0] == server.lone(PROMPTS[1], 6)
