"""`wedlm-hf serve`: transformers' own OpenAI-compatible server, on 127.0.0.1, decoding with WeDLM."""

import pytest
from transformers.cli.serving import model_manager
from transformers.cli.serving import utils as serving_utils

import json
from patience import PATIENCE_S

import transformers
import wedlm_hf
from local_server import start_server

openai = pytest.importorskip("openai", reason="the serve extra is not installed: pip install 'wedlm-hf[serve]'")
serving = pytest.importorskip("wedlm_hf.serving")

PROMPT = "1, 2, 3, 4,"
HOOKED = [(transformers, "WeDLMForCausalLM"), (model_manager, "ModelManager"), (serving_utils, "GenerationState")]
"""What `serve` replaces while it runs."""
MAX_TOKENS = 16
SERVED = "wedlm-tiny-code"
"""The name the server is started with (as `wedlm-hf serve wedlm-tiny-code` does): the id clients send."""


@pytest.fixture(scope="module")
def server():
    """The server in a thread of this process (so the test can count the model's forwards), stopped at the end."""
    running, port = start_server(name=SERVED)
    (timed_model,) = running._model_manager.loaded_models.values()
    forwards = []
    hook = timed_model.model.register_forward_hook(lambda module, args, output: forwards.append(1))
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", timeout=PATIENCE_S, max_retries=0)
    yield client, timed_model.model, forwards
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
    assert completion.choices[0].text
    with pytest.raises(openai.BadRequestError):  # another name is refused, not answered by this model
        client.completions.create(model="another-model", prompt=PROMPT, max_tokens=4)


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
