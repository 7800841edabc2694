"""`wedlm-hf serve`: transformers' own OpenAI-compatible server, on 127.0.0.1, decoding with WeDLM."""

import json
import socket

import httpx
import pytest
import torch
import transformers
from transformers import LogitsProcessorList
from transformers.cli.serving import model_manager
from transformers.cli.serving import utils as serving_utils
from patience import PATIENCE_S

import wedlm_hf
from local_server import free_port, start_server

openai = pytest.importorskip("openai", reason="the serve extra is not installed: pip install 'wedlm-hf[serve]'")
serving = pytest.importorskip("wedlm_hf.serving", exc_type=ImportError)  # says which transformers it needs

from wedlm_hf.generation.penalties import OpenAIPenalties  # noqa: E402

PROMPT = "1, 2, 3, 4,"
HOOKED = [(transformers, "WeDLMForCausalLM"), (model_manager, "ModelManager"), (serving_utils, "GenerationState")]
"""What `serve` replaces while it runs."""
MAX_TOKENS = 16
SERVED = "wedlm-tiny-code"
"""The name the server is started with (as `wedlm-hf serve wedlm-tiny-code` does): the id clients send."""
POISON = "zzzz"
FAULT = 'injected "quoted" fault'
"""What the fixture's hook raises in a forward whose input holds `POISON`'s tokens (the quotes must survive)."""
TOKENIZER = transformers.AutoTokenizer.from_pretrained(wedlm_hf.DEFAULT_MODEL)


def fail_on(prompt: str, error: BaseException):
    poison = torch.tensor(TOKENIZER(prompt)["input_ids"])

    def fault(module, args, kwargs):
        ids = kwargs["input_ids"] if "input_ids" in kwargs else args[0]
        if ids.shape[1] >= len(poison) and (ids.unfold(1, len(poison), 1) == poison).all(-1).any():
            raise error

    return fault


@pytest.fixture(scope="module")
def server():
    """The server in a thread of this process (so the test can count the model's forwards), stopped at the end."""
    running, port = start_server(name=SERVED)
    (timed_model,) = running._model_manager.loaded_models.values()
    forwards = []
    hooks = [
        timed_model.model.register_forward_hook(lambda module, args, output: forwards.append(1)),
        timed_model.model.register_forward_pre_hook(fail_on(POISON, RuntimeError(FAULT)), with_kwargs=True),
    ]
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", timeout=PATIENCE_S, max_retries=0)
    yield client, timed_model.model, forwards
    for hook in hooks:
        hook.remove()
    running.kill_server()


def count_forwards(forwards: list, request):
    forwards.clear()
    result = request()
    return result, len(forwards)


def test_the_served_model_id_is_the_name_the_user_gave(server):
    client, _, _ = server
    assert [model.id for model in client.models.list()] == [SERVED]
    completion = client.completions.create(model=SERVED, prompt=PROMPT, max_tokens=4)
    assert completion.choices[0].text and completion.model == SERVED  # not transformers' "wedlm-tiny-code@main"
    chunks = list(client.chat.completions.create(
        model=SERVED, messages=[{"role": "user", "content": PROMPT}], max_tokens=4, stream=True
    ))
    assert {chunk.model for chunk in chunks} == {SERVED}
    with pytest.raises(openai.BadRequestError, match=f"pinned to '{SERVED}'; requested 'another-model'") as refused:
        client.completions.create(model="another-model", prompt=PROMPT, max_tokens=4)
    assert refused.value.type == "invalid_request_error"


def test_loaded_model_decodes_with_wedlm_by_default(server):
    _, model, _ = server
    assert isinstance(model, wedlm_hf.WeDLMGenerationMixin)
    assert model.generation_config.decoding == "wedlm"


def test_completion_matches_local_wedlm_generate(server):
    client, model, forwards = server
    completion, calls = count_forwards(
        forwards, lambda: client.completions.create(model=SERVED, prompt=PROMPT, max_tokens=MAX_TOKENS)
    )
    tokenizer = transformers.AutoTokenizer.from_pretrained(wedlm_hf.DEFAULT_MODEL)
    inputs = tokenizer(PROMPT, return_tensors="pt")
    local = model.generate(**inputs, max_new_tokens=MAX_TOKENS, return_dict_in_generate=True)
    new_tokens = local.sequences[0, inputs["input_ids"].shape[1] :]
    assert completion.choices[0].text == tokenizer.decode(new_tokens, skip_special_tokens=True)
    assert calls == local.wedlm_stats.summary()["forwards"] < MAX_TOKENS  # WeDLM: several tokens per forward
    assert completion.usage.completion_tokens == len(new_tokens) == MAX_TOKENS
    assert completion.choices[0].finish_reason == "length"


def stream_chat(client, **extra):
    chunks = list(
        client.chat.completions.create(
            model=SERVED,
            messages=[{"role": "user", "content": PROMPT}],
            max_tokens=MAX_TOKENS,
            stream=True,
            **extra,
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    usage = [c.usage for c in chunks if c.usage is not None]
    return text, finish, usage


def test_streamed_chat_usage_and_finish_reason_match_autoregressive(server):
    client, _, forwards = server
    (text, finish, usage), wedlm_calls = count_forwards(forwards, lambda: stream_chat(client))
    ar_config = {"decoding": "ar", "max_new_tokens": MAX_TOKENS, "do_sample": False}
    (ar_text, ar_finish, ar_usage), ar_calls = count_forwards(
        forwards, lambda: stream_chat(client, extra_body={"generation_config": json.dumps(ar_config)})
    )
    assert ar_calls == MAX_TOKENS and wedlm_calls < MAX_TOKENS  # the two requests really decoded differently
    assert text == ar_text  # counting: the tiny checkpoint's WeDLM output is its greedy output
    assert ar_finish == ["length"] and ar_usage[-1].completion_tokens == MAX_TOKENS
    # the server counts streamer puts as tokens: right only with one put per committed token
    assert finish == ar_finish
    assert usage[-1].completion_tokens == ar_usage[-1].completion_tokens


def test_serve_command_sets_the_generation_config_of_every_request(monkeypatch):
    from wedlm_hf_cli import main

    calls = []
    monkeypatch.setattr(serving, "serve", lambda model, **options: calls.append((model, options)))
    assert main(["serve", "--lossless", "--threshold", "none", "--window-size", "8", "--port", "9"]) == 0
    ((model, options),) = calls
    assert model == wedlm_hf.DEFAULT_MODEL and options["port"] == 9 and options["host"] == "127.0.0.1"
    assert options["name"] == SERVED  # clients send the name, not the folder it stands for
    assert options["generation_defaults"] == {
        "wedlm_lossless": True,
        "wedlm_entropy_threshold": None,
        "wedlm_window_size": 8,
    }


def test_serve_takes_an_api_key_and_warns_when_exposed_without_one(monkeypatch, capsys):
    from wedlm_hf_cli import main

    calls = []
    monkeypatch.setattr(serving, "serve", lambda model, **options: calls.append(options["api_key"]))
    monkeypatch.delenv("WEDLM_API_KEY", raising=False)
    assert main(["serve", "--host", "0.0.0.0"]) == 0
    assert "0.0.0.0 is reachable from other machines and no API key is set" in capsys.readouterr().err
    assert main(["serve", "--host", "0.0.0.0", "--api-key", "flag-key"]) == 0
    monkeypatch.setenv("WEDLM_API_KEY", "env-key")
    assert main(["serve", "--host", "0.0.0.0"]) == 0 and main(["serve"]) == 0
    assert calls == [None, "flag-key", "env-key", "env-key"] and capsys.readouterr().err == ""
    with pytest.raises(ValueError, match="the API key is empty"):
        serving.hooks.serve(
            wedlm_hf.DEFAULT_MODEL, host="127.0.0.1", port=free_port(), generation_defaults={}, api_key=" "
        )


def test_model_manager_applies_the_defaults_of_its_own_server():
    """The hooks give the server a manager bound to its defaults, and leave transformers as they found it."""
    original, found = model_manager.ModelManager, transformers.__dict__.get("WeDLMForCausalLM")
    with serving.ServeHooks({"wedlm_lossless": True, "wedlm_window_size": 4}):
        assert transformers.WeDLMForCausalLM is wedlm_hf.WeDLMForCausalLM  # where the server looks it up
        manager = model_manager.ModelManager(device="cpu", force_model=wedlm_hf.DEFAULT_MODEL)  # as `Serve` builds it
        other = serving.WeDLMModelManager(device="cpu", generation_defaults={"wedlm_window_size": 8})
    assert model_manager.ModelManager is original and transformers.__dict__.get("WeDLMForCausalLM") is found
    (timed_model,) = manager.loaded_models.values()
    config = timed_model.model.generation_config
    assert (config.decoding, config.wedlm_lossless, config.wedlm_window_size) == ("wedlm", True, 4)
    assert manager.generation_defaults != other.generation_defaults  # settings per server, not per class
    manager.shutdown()
    other.shutdown()
    with pytest.raises(ValueError, match="serve cannot set"):
        serving.ServeHooks({"num_beams": 4})
    with pytest.raises(ValueError, match="wedlm_window_size"):
        serving.ServeHooks({"wedlm_window_size": 0})


def test_hooks_last_as_long_as_the_server():
    found = {name: owner.__dict__.get(name) for owner, name in HOOKED}
    running, _ = start_server(batching={"max_batch_size": 2})
    assert isinstance(running._model_manager, serving.WeDLMModelManager)
    assert running._generation_state.batching == {"max_batch_size": 2}
    assert transformers.WeDLMForCausalLM is wedlm_hf.WeDLMForCausalLM  # a reload after an idle timeout finds it
    running.kill_server()
    assert {name: owner.__dict__.get(name) for owner, name in HOOKED} == found


def complete(client, prompt: str = PROMPT, **fields) -> str:
    return client.completions.create(model=SERVED, prompt=prompt, max_tokens=MAX_TOKENS, **fields).choices[0].text


def local(model, seed: int | None = None, prompt: str = PROMPT, **options) -> str:
    """What `generate` gives `prompt` here (sampled from `torch.manual_seed(seed)`)."""
    inputs = TOKENIZER(prompt, return_tensors="pt")
    if seed is not None:
        torch.manual_seed(seed)
    output = model.generate(**inputs, max_new_tokens=MAX_TOKENS, **options)
    return TOKENIZER.decode(output[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True)


def test_temperature_above_zero_samples_and_a_seed_reproduces_the_sample(server):
    """OpenAI's meaning on a greedy model: temperature 1.5 samples, with no top-k (each seed its own text, the one
    `generate` draws after that seed with `top_k=0`; transformers' default would be 50), temperature 0 is greedy."""
    client, model, _ = server
    texts = [complete(client, temperature=1.5, seed=seed) for seed in (1, 2, 3)]
    assert len(set(texts)) == 3
    assert complete(client, temperature=1.5, seed=1) == texts[0]
    assert texts == [local(model, seed, do_sample=True, temperature=1.5, top_k=0) for seed in (1, 2, 3)]
    assert texts != [local(model, seed, do_sample=True, temperature=1.5) for seed in (1, 2, 3)]
    assert complete(client, temperature=0) == complete(client) == local(model)


def test_vllm_sampling_fields_are_accepted(server):
    client, model, _ = server
    fields = {"top_k": 3, "min_p": 0.05, "repetition_penalty": 1.3}
    sampled = complete(client, temperature=1.5, seed=2, extra_body=fields)
    assert sampled == local(model, 2, do_sample=True, temperature=1.5, **fields)
    assert complete(client, extra_body={"repetition_penalty": 1.3}) == local(model, repetition_penalty=1.3)
    assert complete(client, top_p=1.0, extra_body={"top_k": -1}) == local(model)  # neutral values on a greedy request
    with pytest.raises(openai.BadRequestError, match="`top_k` shapes sampling, and this request does not sample") as e:
        complete(client, extra_body={"top_k": 3})
    assert e.value.param == "top_k"


def test_choices_echo_logprobs_and_token_prompts_one_request_at_a_time(server):
    """`n`, `echo`, `logprobs` and token-id prompts without continuous batching: one `generate()` per choice, and
    streamed pieces labelled with their tokens by the streamer `generate()` feeds."""
    client, model, _ = server
    ids = TOKENIZER(PROMPT)["input_ids"]
    answer = client.completions.create(model=SERVED, prompt=ids, max_tokens=MAX_TOKENS, n=2, logprobs=1, echo=True)
    assert [choice.text for choice in answer.choices] == [PROMPT + local(model)] * 2
    output = TOKENIZER(local(model))["input_ids"]
    with torch.no_grad():
        reference = torch.log_softmax(model(torch.tensor([ids + output])).logits[0], dim=-1)
    expected = [float(reference[i - 1, token]) for i, token in enumerate(ids + output) if i > 0]
    first, *served = answer.choices[1].logprobs.token_logprobs
    assert first is None and served == pytest.approx(expected, abs=1e-4)
    chunks = client.completions.create(model=SERVED, prompt=PROMPT, max_tokens=MAX_TOKENS, logprobs=0, stream=True)
    parts = [c.choices[0].logprobs for c in chunks if c.choices and c.choices[0].logprobs]
    streamed = [value for part in parts for value in part.token_logprobs]
    assert streamed == pytest.approx(expected[len(ids) - 1 :], abs=1e-4)
    sampled = client.completions.create(
        model=SERVED, prompt=PROMPT, max_tokens=MAX_TOKENS, n=2, temperature=1.5, seed=5
    )
    assert [choice.text for choice in sampled.choices] == [complete(client, temperature=1.5, seed=s) for s in (5, 6)]


CODE = "def f(x):\n    return x\n"
"""A prompt whose greedy continuation repeats tokens, so that OpenAI's penalties change it."""


def penalised_greedy(model, frequency: float, presence: float) -> str:
    """Greedy decoding of `CODE` with OpenAI's penalties as OpenAI defines them, one full forward per token."""
    prompt = TOKENIZER(CODE)["input_ids"]
    output = []
    for _ in range(MAX_TOKENS):
        logits = model(torch.tensor([prompt + output])).logits[0, -1]
        counts = torch.bincount(torch.tensor(output, dtype=torch.long), minlength=logits.shape[-1])
        token = int((logits - frequency * counts - presence * (counts > 0)).argmax())
        output.append(token)
        if token == model.generation_config.eos_token_id:
            break
    return TOKENIZER.decode(output, skip_special_tokens=True)


@pytest.mark.parametrize("decoding", [{"decoding": "ar"}, {"decoding": "wedlm", "wedlm_lossless": True}], ids=str)
def test_frequency_and_presence_penalties_have_openais_meaning(server, decoding):
    client, model, _ = server
    with torch.no_grad():
        expected = penalised_greedy(model, 1.5, 0.5)
    assert expected != local(model, prompt=CODE, decoding="ar")  # the penalties change this output
    served = complete(
        client, CODE, frequency_penalty=1.5, presence_penalty=0.5,
        extra_body={"generation_config": json.dumps(decoding)},
    )
    assert served == expected


def test_penalties_are_applied_in_plain_wedlm_decoding_too(server):
    """Plain WeDLM mode (the server's default here) applies them over the committed tokens, as `generate` does
    with the same processor."""
    client, model, _ = server
    penalties = OpenAIPenalties(len(TOKENIZER(PROMPT)["input_ids"]), 1.5, 0.5)
    expected = local(model, logits_processor=LogitsProcessorList([penalties]))
    assert expected != local(model)
    assert complete(client, frequency_penalty=1.5, presence_penalty=0.5) == expected


def test_penalties_out_of_range_are_refused_naming_the_field(server):
    client, _, _ = server
    for field, value in [("frequency_penalty", 2.5), ("presence_penalty", -3), ("temperature", -1), ("seed", "x")]:
        with pytest.raises(openai.BadRequestError, match=f"`{field}` must be") as refused:
            complete(client, extra_body={field: value})
        assert refused.value.param == field and refused.value.type == "invalid_request_error"


def test_every_error_reaches_the_openai_client_with_its_message(server):
    client, _, _ = server
    with pytest.raises(openai.UnprocessableEntityError, match="Unexpected fields in the request: {'bogus'}"):
        complete(client, extra_body={"bogus": 1})
    with pytest.raises(openai.InternalServerError, match=FAULT) as failed:
        client.completions.create(model=SERVED, prompt=POISON, max_tokens=4)
    assert failed.value.type == "server_error"
    messages = [{"role": "user", "content": POISON}]
    with pytest.raises(openai.APIError, match=FAULT):  # a streamed error event, valid JSON despite the quotes
        list(client.chat.completions.create(model=SERVED, messages=messages, max_tokens=4, stream=True))
    with pytest.raises(openai.APIError, match=FAULT):
        list(client.completions.create(model=SERVED, prompt=POISON, max_tokens=4, stream=True))


def test_malformed_json_is_an_openai_shaped_422(server):
    client, _, _ = server
    reply = httpx.post(
        f"{client.base_url}completions", content='{"model": ', headers={"content-type": "application/json"},
        timeout=PATIENCE_S,
    )
    error = reply.json()["error"]
    assert reply.status_code == 422 and error["type"] == "invalid_request_error"
    assert error["message"].startswith("JSON decode error")


def test_a_busy_port_is_one_line_and_exit_1(capsys):
    from wedlm_hf_cli import main

    port = free_port()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", port))
        taken.listen()
        assert main(["serve", "--port", str(port)]) == 1
    out, err = capsys.readouterr()
    assert "serving on" not in out
    in_use = f"port {port} on 127.0.0.1 is in use (another server?): stop it, or pick another port"
    assert err == f"wedlm-hf serve: error: {in_use}\n"
