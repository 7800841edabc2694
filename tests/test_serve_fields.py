"""Every field of OpenAI's completions and chat-completions requests, sent through the official `openai` client to
`wedlm-hf serve --continuous-batching` behind an API key: each is honoured (its effect checked against the model
itself) or refused with HTTP 400 naming it (`param`); none is silently dropped."""

import inspect
import json
import logging
import time
from pathlib import Path

import pytest
import torch
import transformers
from patience import PATIENCE_S
from transformers import LogitsProcessorList

import wedlm_hf
from local_server import start_server

openai = pytest.importorskip("openai", reason="the serve extra is not installed: pip install 'wedlm-hf[serve]'")
httpx = pytest.importorskip("httpx")
pytest.importorskip("wedlm_hf.serving", exc_type=ImportError)  # says which transformers it needs

from openai.types import completion_create_params  # noqa: E402
from openai.types.chat import completion_create_params as chat_create_params  # noqa: E402

from wedlm_hf.generation.penalties import OpenAIPenalties  # noqa: E402
from wedlm_hf.serving.fields import CHAT_COMPLETIONS, COMPLETIONS, REFUSED, SERVED  # noqa: E402

SERVED_NAME = "wedlm-tiny-code"
KEY = "a-test-key"
PROMPT, MESSAGES, MAX_TOKENS = "1, 2, 3,", [{"role": "user", "content": "1, 2, 3,"}], 12
TOKENIZER = transformers.AutoTokenizer.from_pretrained(wedlm_hf.DEFAULT_MODEL)
REFUSING = {  # a value of each refused field that asks for what the server cannot do
    "suffix": "    return x\n",
    "response_format": {"type": "json_object"},
    "audio": {"voice": "alloy", "format": "wav"},
    "modalities": ["text", "audio"],
    "functions": [{"name": "f", "parameters": {"type": "object"}}],
    "function_call": "auto",
    "prediction": {"type": "content", "content": "4, 5, 6,"},
    "reasoning_effort": "low",
    "verbosity": "low",
    "web_search_options": {},
    "moderation": {"model": "omni-moderation-latest"},
    "store": True,
    "metadata": {"project": "x"},
    "service_tier": "priority",
    "prompt_cache_key": "k",
    "prompt_cache_options": {"ttl": "1h"},
    "prompt_cache_retention": "24h",
    "tool_choice": "required",
    "parallel_tool_calls": False,
}


class Server:
    def __init__(self, client, base_url, model):
        self.client, self.base_url, self.model = client, base_url, model

    def complete(self, **fields):
        return self.client.completions.create(
            **{"model": SERVED_NAME, "prompt": PROMPT, "max_tokens": MAX_TOKENS, **fields}
        )

    def chat(self, **fields):
        return self.client.chat.completions.create(
            **{"model": SERVED_NAME, "messages": MESSAGES, "max_tokens": MAX_TOKENS, **fields}
        )

    def lone(self, ids: list[int], max_tokens: int = MAX_TOKENS) -> list[int]:
        """What `generate` gives the prompt `ids` alone (greedy WeDLM, the server's decoding)."""
        output = self.model.generate(torch.tensor([ids]), max_new_tokens=max_tokens)
        return output[0, len(ids) :].tolist()

    def logprobs(self, ids: list[int]) -> torch.Tensor:
        """The model's log-probabilities after each position of `ids`, from one plain forward."""
        with torch.no_grad():
            return torch.log_softmax(self.model(torch.tensor([ids])).logits[0].float(), dim=-1)


@pytest.fixture(scope="module")
def server():
    running, port = start_server(name=SERVED_NAME, batching={"max_batch_size": 4}, api_key=KEY)
    (timed_model,) = running._model_manager.loaded_models.values()
    base_url = f"http://127.0.0.1:{port}"
    client = openai.OpenAI(base_url=f"{base_url}/v1", api_key=KEY, timeout=PATIENCE_S, max_retries=0)
    yield Server(client, base_url, timed_model.model)
    running.kill_server()


def text_of(ids: list[int]) -> str:
    return TOKENIZER.decode(ids, skip_special_tokens=True)


PROMPT_IDS = TOKENIZER(PROMPT)["input_ids"]
CHAT_IDS = TOKENIZER.apply_chat_template(MESSAGES, add_generation_prompt=True, return_dict=True)["input_ids"]


def test_the_table_has_every_field_the_openai_client_sends():
    for params, endpoint in ((completion_create_params, COMPLETIONS), (chat_create_params, CHAT_COMPLETIONS)):
        sent = set(params.CompletionCreateParamsBase.__annotations__) | {"stream"}
        assert sent <= endpoint, sent - endpoint
        assert endpoint <= set(SERVED) | set(REFUSED)
    assert set(REFUSED) == set(REFUSING)


def test_the_docs_show_every_field():
    section = (Path(__file__).parents[1] / "docs" / "serving.md").read_text().split("## What a request can set")[1]
    section = section.split("\n## ")[0]
    assert [field for field in [*SERVED, *REFUSED] if f"`{field}`" not in section] == []


def _send(create, field: str, value, **fields):
    """`create` with `field` as the client's own argument where it has one, else in the body's extras."""
    if field in inspect.signature(create).parameters:
        return create(**{field: value}, **fields)
    return create(extra_body={field: value}, **fields)


@pytest.mark.parametrize("field", sorted(REFUSED))
def test_a_field_that_cannot_be_served_is_refused_by_name(server, field):
    takes = [(create, fields) for create, fields, endpoint in (
        (server.client.completions.create, {"prompt": PROMPT}, COMPLETIONS),
        (server.client.chat.completions.create, {"messages": MESSAGES}, CHAT_COMPLETIONS),
    ) if field in endpoint]
    assert takes
    for create, fields in takes:
        with pytest.raises(openai.BadRequestError, match=f"`{field}` is not served") as refused:
            _send(create, field, REFUSING[field], model=SERVED_NAME, max_tokens=4, **fields)
        assert refused.value.param == field and refused.value.type == "invalid_request_error"
        plain = create(model=SERVED_NAME, max_tokens=4, **fields)
        for neutral in REFUSED[field][0]:  # values that ask for nothing more are served as the plain request
            if neutral is not None:
                answer = _send(create, field, neutral, model=SERVED_NAME, max_tokens=4, **fields)
                assert answer.choices[0].model_dump(exclude={"index"}) == plain.choices[0].model_dump(exclude={"index"})


def test_model_prompt_and_max_tokens(server):
    expected = server.lone(PROMPT_IDS)
    completion = server.complete()
    assert completion.model == SERVED_NAME and completion.choices[0].text == text_of(expected)
    assert completion.usage.completion_tokens == MAX_TOKENS and completion.choices[0].finish_reason == "length"
    with pytest.raises(openai.BadRequestError, match="pinned to") as refused:
        server.complete(model="another-model")
    assert refused.value.param == "model"
    by_ids = server.complete(prompt=PROMPT_IDS)  # OpenAI's and vLLM's token-id prompt
    assert by_ids.choices[0].text == completion.choices[0].text
    other = TOKENIZER("def add(a, b):")["input_ids"]
    several = server.complete(prompt=[PROMPT, other], max_tokens=6)  # a list of prompts: one choice each
    assert [c.index for c in several.choices] == [0, 1]
    assert [c.text for c in several.choices] == [text_of(server.lone(PROMPT_IDS, 6)), text_of(server.lone(other, 6))]
    assert several.usage.prompt_tokens == len(PROMPT_IDS) + len(other)
    for prompt in ([], [PROMPT_IDS, 3.5], [-1, 5]):
        with pytest.raises(openai.BadRequestError, match="prompt") as refused:
            server.complete(prompt=prompt)
        assert refused.value.param == "prompt"
    chat = server.chat(max_tokens=None, max_completion_tokens=5)
    assert chat.usage.completion_tokens == 5 and chat.model == SERVED_NAME


def test_messages_go_through_the_chat_template(server):
    ids = CHAT_IDS
    assert server.chat().choices[0].message.content == text_of(server.lone(ids))


def test_temperature_top_p_and_seed(server):
    sampled = [server.complete(temperature=1.5, seed=seed).choices[0].text for seed in (1, 2, 3)]
    assert len(set(sampled)) > 1 and server.complete(temperature=1.5, seed=1).choices[0].text == sampled[0]
    assert server.complete(temperature=0).choices[0].text == text_of(server.lone(PROMPT_IDS))
    narrow = {server.complete(temperature=1.5, top_p=1e-6, seed=seed).choices[0].text for seed in (1, 2, 3)}
    assert len(narrow) == 1  # the most likely token alone is left to draw from


def test_n_choices_are_requests_of_their_own(server):
    completion = server.complete(n=3, temperature=1.5, seed=7)
    assert [c.index for c in completion.choices] == [0, 1, 2]
    assert [c.text for c in completion.choices] == [
        server.complete(temperature=1.5, seed=7 + i).choices[0].text for i in range(3)
    ]
    assert completion.usage.prompt_tokens == len(PROMPT_IDS)  # the prompt counted once
    assert completion.usage.completion_tokens == sum(len(TOKENIZER(c.text)["input_ids"]) for c in completion.choices)
    chat = server.chat(n=2)
    assert [c.index for c in chat.choices] == [0, 1] and chat.choices[0].message == chat.choices[1].message
    assert len(server.complete(n=2, best_of=2).choices) == 2
    for fields, param in (({"n": 0}, "n"), ({"n": 129}, "n"), ({"n": 1, "best_of": 3}, "best_of")):
        with pytest.raises(openai.BadRequestError) as refused:
            server.complete(**fields)
        assert refused.value.param == param


def test_stop_and_stream(server):
    full = server.complete().choices[0].text
    stopped = server.complete(stop=[" 6"])
    assert stopped.choices[0].text == full[: full.index(" 6")]  # OpenAI: the text ends before the stop string
    assert stopped.choices[0].finish_reason == "stop"
    streamed_stop = list(server.complete(stop=[" 6", "7"], stream=True))
    assert "".join(c.choices[0].text for c in streamed_stop if c.choices) == stopped.choices[0].text
    chat_stopped = server.chat(stop=" 6").choices[0].message.content
    assert chat_stopped == server.chat().choices[0].message.content.split(" 6")[0]
    with pytest.raises(openai.BadRequestError) as refused:
        server.complete(stop=[""])
    assert refused.value.param == "stop"
    chunks = list(server.complete(stream=True))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == full
    assert [c.usage.completion_tokens for c in chunks if c.usage] == [MAX_TOKENS]  # usage: a chunk of its own
    without_usage = list(server.complete(stream=True, stream_options={"include_usage": False}))
    assert [c for c in without_usage if c.usage] == []
    with_usage = list(server.chat(stream=True, stream_options={"include_usage": True}))
    assert [c.usage.completion_tokens for c in with_usage if c.usage] == [MAX_TOKENS]
    with pytest.raises(openai.BadRequestError) as refused:
        server.complete(stream_options={"include_usage": True})
    assert refused.value.param == "stream_options"
    streamed = list(server.complete(stream=True, n=2, max_tokens=6))
    for index in (0, 1):
        assert "".join(c.choices[0].text for c in streamed if c.choices and c.choices[0].index == index) == text_of(
            server.lone(PROMPT_IDS, 6)
        )


def check_logprobs(server, ids: list[int], first: int, tokens, token_logprobs, top):
    """Served log-probabilities of `ids[first:]` against one forward of the model over `ids`."""
    reference = server.logprobs(ids)
    assert len(token_logprobs) == len(ids) - first
    for position, (token, served) in enumerate(zip(ids[first:], token_logprobs), start=first):
        if position == 0:
            assert served is None
            continue
        assert served == pytest.approx(float(reference[position - 1, token]), abs=1e-4)
        best = reference[position - 1].topk(len(top[position - first]))
        assert sorted(top[position - first].values(), reverse=True) == pytest.approx(best.values.tolist(), abs=1e-4)
    assert tokens == [TOKENIZER.decode([token], skip_special_tokens=True) for token in ids[first:]]


def completion_logprobs(logprobs) -> tuple:
    return logprobs.tokens, logprobs.token_logprobs, logprobs.top_logprobs


def test_logprobs_and_echo(server):
    output = server.lone(PROMPT_IDS)
    completion = server.complete(logprobs=3)
    logprobs = completion.choices[0].logprobs
    check_logprobs(server, PROMPT_IDS + output, len(PROMPT_IDS), *completion_logprobs(logprobs))
    echoed = server.complete(logprobs=2, echo=True).choices[0]
    assert echoed.text == PROMPT + completion.choices[0].text
    check_logprobs(server, PROMPT_IDS + output, 0, *completion_logprobs(echoed.logprobs))
    assert echoed.logprobs.text_offset[len(PROMPT_IDS)] == len(PROMPT)
    scored = server.complete(max_tokens=0, echo=True, logprobs=1).choices[0]  # the prompt scored, nothing generated
    assert scored.text == PROMPT and scored.logprobs.token_logprobs == echoed.logprobs.token_logprobs[: len(PROMPT_IDS)]
    streamed = [c.choices[0] for c in server.complete(logprobs=2, echo=True, stream=True) if c.choices]
    joined = [value for c in streamed if c.logprobs for value in c.logprobs.token_logprobs]
    assert "".join(c.text for c in streamed) == echoed.text
    assert joined == pytest.approx(echoed.logprobs.token_logprobs, abs=1e-5)
    for fields, param in (({"logprobs": 21}, "logprobs"), ({"max_tokens": 0}, "max_tokens")):
        with pytest.raises(openai.BadRequestError) as refused:
            server.complete(**fields)
        assert refused.value.param == param


def test_chat_logprobs_and_top_logprobs(server):
    chat = server.chat(logprobs=True, top_logprobs=2)
    ids = CHAT_IDS
    content = chat.choices[0].logprobs.content
    assert len(content) == chat.usage.completion_tokens
    output = [TOKENIZER.convert_tokens_to_ids(TOKENIZER.tokenize(entry.token))[0] for entry in content]
    top = [{alternative.token: alternative.logprob for alternative in entry.top_logprobs} for entry in content]
    check_logprobs(server, ids + output, len(ids), [e.token for e in content], [e.logprob for e in content], top)
    streamed = [c.choices[0] for c in server.chat(logprobs=True, stream=True) if c.choices and c.choices[0].logprobs]
    expected = [entry.logprob for entry in content]
    assert [entry.logprob for c in streamed for entry in c.logprobs.content] == pytest.approx(expected, abs=1e-5)
    assert server.chat(logprobs=False).choices[0].logprobs is None
    with pytest.raises(openai.BadRequestError) as refused:
        server.chat(top_logprobs=2)
    assert refused.value.param == "top_logprobs"


def test_penalties_and_logit_bias(server):
    prompt = TOKENIZER("1, 2, 3, 4,")["input_ids"]  # counting repeats ", ": the penalties change its output
    penalised = server.complete(prompt=prompt, max_tokens=16, frequency_penalty=1.5, presence_penalty=0.5)
    processor = LogitsProcessorList([OpenAIPenalties(len(prompt), 1.5, 0.5)])
    expected = server.model.generate(torch.tensor([prompt]), max_new_tokens=16, logits_processor=processor)
    assert penalised.choices[0].text == text_of(expected[0, len(prompt) :].tolist()) != text_of(server.lone(prompt, 16))
    four = TOKENIZER.convert_tokens_to_ids("4")
    assert "4" in server.complete().choices[0].text
    for create in (server.complete, server.chat):
        answer = create(logit_bias={str(four): -100}).choices[0]
        assert "4" not in (answer.text if hasattr(answer, "text") else answer.message.content)
    with pytest.raises(openai.BadRequestError) as refused:
        server.complete(logit_bias={"four": 5})
    assert refused.value.param == "logit_bias"


def test_end_user_ids_are_logged_with_the_request(server, caplog):
    with caplog.at_level(logging.INFO, logger="wedlm_hf.serving"):
        server.complete(user="user-17")
        server.chat(user="user-18", safety_identifier="hash-18")
    logged = " ".join(record.getMessage() for record in caplog.records)
    assert "user 'user-17'" in logged and "user 'user-18', safety_identifier 'hash-18'" in logged


def test_tools_the_chat_template_ignores_are_refused(server):
    tool = {"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}
    with pytest.raises(openai.BadRequestError, match="does not show tools") as refused:
        server.chat(tools=[tool])
    assert refused.value.param == "tools"


def test_vllm_and_transformers_extras(server):
    extras = {"top_k": 1, "min_p": 0.0, "repetition_penalty": 1.0}
    greedy = server.complete().choices[0].text
    assert server.complete(temperature=1.5, seed=4, extra_body=extras).choices[0].text == greedy  # top_k 1
    config = {"generation_config": json.dumps({"max_new_tokens": 3})}
    assert server.complete(max_tokens=None, extra_body=config).usage.completion_tokens == 3


def test_unknown_fields_and_oversized_prompts_are_refused_by_name(server):
    with pytest.raises(openai.UnprocessableEntityError, match="bogus") as refused:
        server.complete(extra_body={"bogus": 1})
    assert refused.value.param == "bogus"
    start = time.monotonic()
    for send, param in ((lambda: server.complete(prompt="1, " * 2_000_000), "prompt"),
                        (lambda: server.chat(messages=[{"role": "user", "content": "x" * 5_000_000}]), "messages"),
                        (lambda: server.complete(prompt=[5] * 5000), "prompt")):
        with pytest.raises(openai.BadRequestError, match="max_position_embeddings") as refused:
            send()
        assert refused.value.param == param
    assert time.monotonic() - start < 5  # refused before tokenizing megabytes


def test_the_api_key_is_asked_of_every_client(server):
    anonymous = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="wrong", max_retries=0, timeout=PATIENCE_S)
    with pytest.raises(openai.AuthenticationError, match="Incorrect API key") as refused:
        anonymous.completions.create(model=SERVED_NAME, prompt=PROMPT, max_tokens=2)
    assert refused.value.status_code == 401 and refused.value.code == "invalid_api_key"
    without = httpx.get(f"{server.base_url}/v1/models", timeout=PATIENCE_S)
    assert without.status_code == 401 and without.json()["error"]["type"] == "invalid_request_error"
    assert httpx.get(f"{server.base_url}/health", timeout=PATIENCE_S).status_code == 200  # probes need no key
    assert [model.id for model in server.client.models.list()] == [SERVED_NAME]


def test_lm_evaluation_harness_scores_through_echo_and_logprobs(server):
    """lm-eval's `local-completions` loglikelihood request: token-id prompts, echo, logprobs, max_tokens 1."""
    completions = pytest.importorskip("lm_eval.models.openai_completions")
    context, continuation = PROMPT_IDS, TOKENIZER(" 4, 5,")["input_ids"]
    harness = type("Harness", (), {"model": SERVED_NAME})()
    payload = completions.LocalCompletionsAPI._create_payload(harness, [context + continuation])
    reply = httpx.post(f"{server.base_url}/v1/completions", json=payload, headers={"Authorization": f"Bearer {KEY}"},
                       timeout=PATIENCE_S)
    ((loglikelihood, greedy),) = completions.LocalCompletionsAPI.parse_logprobs(reply.json(), ctxlens=[len(context)])
    reference = server.logprobs(context + continuation)
    expected = sum(float(reference[i - 1, token]) for i, token in enumerate(continuation, start=len(context)))
    assert loglikelihood == pytest.approx(expected, abs=1e-4)
    assert greedy == all(reference[i - 1].argmax() == t for i, t in enumerate(continuation, start=len(context)))
