"""The static-shape path (`wedlm_static=True`, generation/pool.py) against the default decoder, the cache-free
reference and greedy AR, and the property it exists for: dynamo traces the step once."""

import pytest
import torch
from test_syncs import SYNCS_PER_STEP, syncs_per_step
from tiny_models import EOS_ID, MASK_ID, random_prompts, tiny_model
from transformers import CompileConfig
from transformers.testing_utils import CaptureLogger

import wedlm_hf
from wedlm_hf.generation import settings
from wedlm_hf.generation.kv_pool import KVPool
from wedlm_hf.generation.reference import reference_decode

MAX_NEW = 24
LENGTHS = {"batch1": [9], "padded": [5, 17, 2]}


def generate(model, input_ids, attention_mask, **kwargs):
    wedlm_hf.enable(model)
    options = dict(decoding="wedlm", max_new_tokens=MAX_NEW, mask_token_id=MASK_ID, return_dict_in_generate=True)
    return model.generate(input_ids=input_ids, attention_mask=attention_mask, **options | kwargs)


def continuations(output, prompt_width: int) -> list[list[int]]:
    return [
        output.sequences[row, prompt_width : prompt_width + length].tolist()
        for row, length in enumerate(output.wedlm_stats.generated)
    ]


@pytest.mark.parametrize("family", ["wedlm", "llama"])
@pytest.mark.parametrize("batch", LENGTHS)
def test_static_matches_default_and_reference(family, batch):
    model = tiny_model(family, seed=1, peak=40)
    input_ids, attention_mask = random_prompts(LENGTHS[batch], seed=4)
    default = generate(model, input_ids, attention_mask, output_scores=True)
    static = generate(model, input_ids, attention_mask, output_scores=True, wedlm_static=True)
    assert torch.equal(static.sequences, default.sequences)
    assert static.wedlm_stats == default.wedlm_stats  # forwards, processed, fill/commit trace
    assert all(torch.allclose(a, b, atol=1e-4) for a, b in zip(static.scores, default.scores))
    for row, tokens in enumerate(continuations(static, input_ids.shape[1])):
        prompt = input_ids[row][attention_mask[row].bool()].tolist()
        expected, forwards = reference_decode(model, prompt, MAX_NEW, MASK_ID, [EOS_ID], 16, 0.4, 0.02)
        assert tokens == expected
        assert static.wedlm_stats.forwards[row] == forwards


@pytest.mark.parametrize("batch", LENGTHS)
def test_static_lossless_equals_greedy(batch):
    model = tiny_model("wedlm", seed=2, peak=40)
    input_ids, attention_mask = random_prompts(LENGTHS[batch], seed=6)
    static = generate(model, input_ids, attention_mask, wedlm_static=True, wedlm_lossless=True)
    default = generate(model, input_ids, attention_mask, wedlm_lossless=True)
    greedy = model.generate(
        input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=MAX_NEW, do_sample=False, decoding="ar"
    )
    assert torch.equal(static.sequences, default.sequences)
    assert static.wedlm_stats == default.wedlm_stats
    width = input_ids.shape[1]
    for row, tokens in enumerate(continuations(static, width)):
        assert tokens == greedy[row, width : width + len(tokens)].tolist()


def test_eager_attention_and_sampling_match_default():
    """Eager attention takes the additive form of the mask; a seeded sampled decode draws the same tokens."""
    model = tiny_model("qwen3", seed=3, peak=40, attn="eager")
    input_ids, attention_mask = random_prompts([4, 11], seed=8)
    assert torch.equal(
        generate(model, input_ids, attention_mask, wedlm_static=True).sequences,
        generate(model, input_ids, attention_mask).sequences,
    )
    sampled = []
    for static in (False, True):
        torch.manual_seed(0)
        sampled.append(generate(model, input_ids, attention_mask, do_sample=True, temperature=1.5, wedlm_static=static))
    assert torch.equal(sampled[0].sequences, sampled[1].sequences)


def test_cache_implementation_static_selects_the_static_path(monkeypatch):
    built = []
    original = KVPool.__init__

    def spy(self, *args, **kwargs):
        built.append(self)
        original(self, *args, **kwargs)

    monkeypatch.setattr(KVPool, "__init__", spy)
    model = tiny_model("wedlm", peak=40)
    input_ids, attention_mask = random_prompts([6, 3], seed=1)
    static = generate(model, input_ids, attention_mask, cache_implementation="static", max_cache_len=200)
    assert len(built) == 1 and built[0].blocks.block_size == 200  # one block of max_cache_len per row
    assert torch.equal(static.sequences, generate(model, input_ids, attention_mask).sequences)
    generate(model, input_ids, attention_mask, cache_implementation="static", wedlm_static=False)
    assert len(built) == 1, "an explicit wedlm_static=False wins over the cache implementation"


def test_blockwise_and_output_logits_match_default():
    model = tiny_model("wedlm", seed=4, peak=40)
    input_ids, attention_mask = random_prompts([7, 3], seed=9)
    options = dict(wedlm_blockwise=True, wedlm_window_size=4, wedlm_entropy_threshold=None, output_logits=True)
    static = generate(model, input_ids, attention_mask, wedlm_static=True, **options)
    default = generate(model, input_ids, attention_mask, **options)
    assert torch.equal(static.sequences, default.sequences) and static.wedlm_stats == default.wedlm_stats
    assert all(torch.allclose(a, b, atol=1e-4) for a, b in zip(static.logits, default.logits))


@pytest.mark.parametrize("window_size,max_new_tokens", [(1, 9), (16, 3)])
def test_small_windows_and_budgets_match_default(window_size, max_new_tokens):
    model = tiny_model("wedlm", seed=6, peak=40)
    input_ids, attention_mask = random_prompts([4, 10], seed=3)
    options = dict(wedlm_window_size=window_size, max_new_tokens=max_new_tokens)
    static = generate(model, input_ids, attention_mask, wedlm_static=True, **options)
    default = generate(model, input_ids, attention_mask, **options)
    assert torch.equal(static.sequences, default.sequences) and static.wedlm_stats == default.wedlm_stats


def test_compile_config_without_the_static_path_warns():
    model = tiny_model("wedlm", peak=40)
    input_ids, attention_mask = random_prompts([6], seed=1)
    with CaptureLogger(settings.logger) as captured:
        generate(model, input_ids, attention_mask, compile_config=CompileConfig())
    assert "cache_implementation='static'" in captured.out


def test_static_rejects_what_it_cannot_do():
    model = tiny_model("wedlm", peak=40)
    input_ids, attention_mask = random_prompts([6], seed=1)
    with pytest.raises(ValueError, match="wedlm_static"):
        generate(model, input_ids, attention_mask, wedlm_static="yes")
    model.config._attn_implementation = "flash_attention_2"
    with pytest.raises(ValueError, match="attn_implementation='sdpa'"):
        generate(model, input_ids, attention_mask, wedlm_static=True)


def test_dynamo_traces_the_step_once():
    """After the warm-up call, more calls (another prompt length, lossless mode, rows finishing at different steps)
    reuse the one graph. A pass-through backend counts what dynamo compiles without needing a C++ compiler; the
    prefill (prompt + first window) runs eagerly, as in transformers' compiled AR decoding."""
    graphs = []

    def counting_backend(graph_module, example_inputs):
        graphs.append(graph_module)
        return graph_module.forward

    torch._dynamo.reset()
    model = tiny_model("wedlm", seed=5, peak=40)
    compiled = dict(wedlm_static=True, compile_config=CompileConfig(backend=counting_backend, mode=None), max_cache_len=96)
    calls = [([5, 17, 9], {}), ([12, 3, 7], {}), ([5, 17, 9], {"wedlm_lossless": True})]
    for index, (lengths, options) in enumerate(calls):
        input_ids, attention_mask = random_prompts(lengths, seed=index)
        output = generate(model, input_ids, attention_mask, **compiled, **options)
        eager = generate(model, input_ids, attention_mask, **options)
        assert torch.equal(output.sequences, eager.sequences)
        if index == 0:
            assert len(set(output.wedlm_stats.forwards)) > 1, "rows should finish at different steps"
        assert len(graphs) == 1, f"call {index} recompiled the step"
    torch._dynamo.reset()


@pytest.mark.parametrize("options", [{}, {"wedlm_lossless": True}])
def test_static_path_keeps_one_host_sync_per_step(monkeypatch, options):
    """Fixed shapes change no host reads: the step's one sync, as on the default path (tests/test_syncs.py)."""
    per_step, where = syncs_per_step(monkeypatch, "wedlm", [5, 9, 3], wedlm_static=True, **options)
    assert 1 <= per_step <= SYNCS_PER_STEP, f"{per_step:.2f} syncs per step: {sorted(set(where))}"
