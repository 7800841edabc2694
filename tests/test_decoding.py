"""The cached, batched WeDLM decoder against the cache-free reference, and its contract."""

import pytest
import transformers
import torch
from tiny_models import EOS_ID, FAMILIES, MASK_ID, PAD_ID, random_prompts, tiny_model

import wedlm_hf
from wedlm_hf.generation.reference import reference_decode

MAX_NEW = 24


def wedlm_generate(model, input_ids, attention_mask, **kwargs):
    wedlm_hf.enable(model)
    options = dict(decoding="wedlm", max_new_tokens=MAX_NEW, mask_token_id=MASK_ID, return_dict_in_generate=True)
    options.update(kwargs)
    return model.generate(input_ids=input_ids, attention_mask=attention_mask, **options)


def continuation(output, row: int, prompt_width: int) -> list[int]:
    """Row's generated tokens up to and including EOS, checking that only padding follows."""
    tokens = output.sequences[row, prompt_width:].tolist()
    length = output.wedlm_stats.generated[row]
    assert all(t == PAD_ID for t in tokens[length:])
    return tokens[:length]


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("window_size,threshold", [(1, 0.4), (4, None), (8, 0.4), (16, 3.0)])
def test_cached_decoder_matches_cache_free_reference(family, window_size, threshold):
    model = tiny_model(family, seed=window_size, peak=40)
    input_ids, attention_mask = random_prompts([5, 11, 2], seed=window_size)
    output = wedlm_generate(
        model, input_ids, attention_mask, wedlm_window_size=window_size, wedlm_entropy_threshold=threshold
    )
    for row in range(3):
        prompt = input_ids[row][attention_mask[row].bool()].tolist()
        expected, forwards = reference_decode(
            model, prompt, MAX_NEW, MASK_ID, [EOS_ID], window_size, threshold, 0.02
        )
        assert continuation(output, row, input_ids.shape[1]) == expected
        assert output.wedlm_stats.forwards[row] == forwards


def test_threshold_that_fills_many_slots_takes_parallel_steps():
    model = tiny_model("wedlm", peak=40)
    input_ids, attention_mask = random_prompts([6])
    output = wedlm_generate(model, input_ids, attention_mask, wedlm_entropy_threshold=5.0, max_new_tokens=32)
    assert output.wedlm_stats.tokens_per_forward[0] > 4
    expected, _ = reference_decode(model, input_ids[0].tolist(), 32, MASK_ID, [EOS_ID], 16, 5.0, 0.02)
    assert continuation(output, 0, 6) == expected


@pytest.mark.parametrize("family", ["wedlm", "llama"])
def test_batched_equals_unbatched(family):
    model = tiny_model(family, seed=3, peak=40)
    lengths = [7, 3, 12]
    input_ids, attention_mask = random_prompts(lengths, seed=5)
    batched = wedlm_generate(model, input_ids, attention_mask)
    for row, length in enumerate(lengths):
        single = wedlm_generate(model, input_ids[row : row + 1, -length:], attention_mask[row : row + 1, -length:])
        assert continuation(batched, row, input_ids.shape[1]) == continuation(single, 0, length)
        assert batched.wedlm_stats.forwards[row] == single.wedlm_stats.forwards[0]


def test_cache_compaction_keeps_outputs(monkeypatch):
    """Compacting after every step (the most aggressive setting) must not change a token."""
    model = tiny_model("qwen3", seed=4, peak=40)
    input_ids, attention_mask = random_prompts([4, 9, 6], seed=2)
    lazy = wedlm_generate(model, input_ids, attention_mask, wedlm_entropy_threshold=1.0)
    compactions = []
    original_compact = wedlm_hf.WeDLMCache.compact

    def counting_compact(self, width):
        compactions.append(self.key_mask.shape[1])
        original_compact(self, width)

    monkeypatch.setattr(wedlm_hf.WeDLMCache, "__init__", _eager_init(wedlm_hf.WeDLMCache.__init__))
    monkeypatch.setattr(wedlm_hf.WeDLMCache, "compact", counting_compact)
    eager = wedlm_generate(model, input_ids, attention_mask, wedlm_entropy_threshold=1.0)
    assert compactions, "rows committing different counts should have left holes to compact"
    assert torch.equal(lazy.sequences, eager.sequences)


def _eager_init(init):
    def eager(self, key_mask, max_wasted_slots=32):
        init(self, key_mask, max_wasted_slots=0)

    return eager


def test_stats_count_real_forwards_and_processed_tokens():
    model = tiny_model("wedlm", seed=1, peak=40)
    input_ids, attention_mask = random_prompts([5, 8], seed=1)
    fed_lengths = []
    model.register_forward_hook(lambda module, args, kwargs, out: fed_lengths.append(kwargs["input_ids"].shape), with_kwargs=True)
    output = wedlm_generate(model, input_ids, attention_mask, wedlm_entropy_threshold=1.0)
    stats = output.wedlm_stats
    assert stats.model_calls == len(fed_lengths) == max(stats.forwards)
    assert stats.generated == [len(continuation(output, r, 8)) for r in range(2)]
    assert stats.p_cache == [g / p for g, p in zip(stats.generated, stats.processed)]
    # every forward after the first feeds only windows: their width bounds the processed tokens of a row
    widths = [shape[1] for shape in fed_lengths]
    widths[0] -= input_ids.shape[1]
    assert max(stats.processed) <= sum(widths)
    assert all(len(f) == g for f, g in zip(stats.fill_steps, stats.generated))
    assert all(fill < commit for row in range(2) for fill, commit in zip(stats.fill_steps[row], stats.commit_steps[row]))


def test_seeded_sampling_is_reproducible_and_top_k_one_is_greedy():
    model = tiny_model("wedlm", seed=2, peak=40)
    input_ids, attention_mask = random_prompts([6, 4], seed=3)
    sample = dict(do_sample=True, temperature=0.7, top_p=0.9, top_k=20)
    torch.manual_seed(11)
    first = wedlm_generate(model, input_ids, attention_mask, **sample)
    torch.manual_seed(11)
    second = wedlm_generate(model, input_ids, attention_mask, **sample)
    assert torch.equal(first.sequences, second.sequences)
    greedy = wedlm_generate(model, input_ids, attention_mask)
    top1 = wedlm_generate(model, input_ids, attention_mask, do_sample=True, top_k=1, temperature=5.0)
    assert torch.equal(greedy.sequences, top1.sequences)
    # slot choice uses the raw entropy, not the warped one: same steps as greedy
    assert greedy.wedlm_stats.forwards == top1.wedlm_stats.forwards


def test_no_state_leaks_between_calls():
    model = tiny_model("wedlm", seed=6, peak=40)
    input_ids, attention_mask = random_prompts([5, 9], seed=6)
    first = wedlm_generate(model, input_ids, attention_mask)
    wedlm_generate(model, input_ids[:1], attention_mask[:1], wedlm_window_size=3, max_new_tokens=7)
    again = wedlm_generate(model, input_ids, attention_mask)
    assert torch.equal(first.sequences, again.sequences)


def test_three_entry_points_agree():
    native = tiny_model("wedlm", seed=8, peak=40)
    input_ids, attention_mask = random_prompts([6], seed=8)
    common = dict(max_new_tokens=MAX_NEW, mask_token_id=MASK_ID)
    via_native = native.generate(input_ids=input_ids, attention_mask=attention_mask, decoding="wedlm", **common)
    plain = tiny_model("qwen3", seed=8, peak=40)
    via_callable = plain.generate(
        input_ids=input_ids, attention_mask=attention_mask, custom_generate=wedlm_hf.wedlm_decode, **common
    )
    assert type(plain).__name__ == "Qwen3ForCausalLM"
    same_object = wedlm_hf.enable(plain)
    assert same_object is plain
    via_enable = plain.generate(input_ids=input_ids, attention_mask=attention_mask, decoding="wedlm", **common)
    assert torch.equal(via_callable, via_enable)
    assert via_native.shape[0] == 1
    # WeDLM (qk-norm) and Qwen3 share weights layout: same seed, same tokens
    assert torch.equal(via_native, via_enable)


def test_ar_decoding_is_untouched():
    model = wedlm_hf.enable(tiny_model("llama", seed=9))
    input_ids, attention_mask = random_prompts([5], seed=9)
    ar = model.generate(input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=10)
    forced = model.generate(input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=10, decoding="ar")
    assert torch.equal(ar, forced)


@pytest.mark.parametrize("mode", ["plain", "blockwise", "lossless"])
@pytest.mark.parametrize("lengths", [[6], [5, 11, 2]])
def test_scores_and_logits_are_those_each_token_was_chosen_from(mode, lengths):
    """`output_scores` / `output_logits`: entry t of row r is the tensor generated token t of row r is the argmax
    of (greedy), in every mode; in lossless mode it is AR's own (what greedy `generate()` returns)."""
    model = wedlm_hf.enable(tiny_model("wedlm", seed=7, peak=40))
    input_ids, attention_mask = random_prompts(lengths, seed=7)
    options = {"blockwise": {"wedlm_blockwise": True}, "lossless": {"wedlm_lossless": True}}.get(mode, {})
    output = wedlm_generate(
        model, input_ids, attention_mask, output_scores=True, output_logits=True, wedlm_entropy_threshold=2.0, **options
    )
    stats = output.wedlm_stats
    assert len(output.scores) == len(output.logits) == max(stats.generated)
    width = input_ids.shape[1]
    for row, count in enumerate(stats.generated):
        tokens = output.sequences[row, width : width + count]
        scores = torch.stack([output.scores[t][row] for t in range(count)])
        logits = torch.stack([output.logits[t][row] for t in range(count)])
        assert torch.equal(scores.argmax(-1), tokens)
        assert torch.equal(logits.argmax(-1), tokens)
        assert (logits != 0).any(1).all(), "every token has real logits, none left at zero"
    if mode == "lossless":
        greedy = model.generate(
            input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=MAX_NEW, do_sample=False,
            output_scores=True, output_logits=True, return_dict_in_generate=True,
        )
        for row, count in enumerate(stats.generated):
            for t in range(count):
                torch.testing.assert_close(output.scores[t][row], greedy.scores[t][row], rtol=1e-4, atol=1e-4)
                torch.testing.assert_close(output.logits[t][row], greedy.logits[t][row], rtol=1e-4, atol=1e-4)


def test_streamer_put_count_equals_generated_tokens():
    """One `put` per committed token, in order, however many tokens a step commits."""

    class CountingStreamer(wedlm_hf.generation.decoding.BaseStreamer):
        def __init__(self):
            self.tokens = []

        def put(self, value):
            self.tokens.extend(value.flatten().tolist())

        def end(self):
            pass

    model = tiny_model("wedlm", seed=1, peak=40)
    constant = tiny_model("wedlm", seed=1, peak=40)
    with torch.no_grad():  # every position predicts token 0, AR and mask alike: lossless accepts its drafts
        constant.lm_head.weight.zero_()
    input_ids, attention_mask = random_prompts([6], seed=1)
    lossless = {"wedlm_lossless": True, "wedlm_entropy_threshold": 100.0}  # (its first window counts as confident)
    for model, options in ((model, {"wedlm_entropy_threshold": 5.0}), (constant, lossless)):
        streamer = CountingStreamer()
        output = wedlm_generate(model, input_ids, attention_mask, streamer=streamer, **options)
        commits = output.wedlm_stats.commit_steps[0]
        assert max(commits.count(step) for step in commits) > 1, "some step commits several tokens"
        assert streamer.tokens == input_ids[0].tolist() + output.sequences[0, 6:].tolist()


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_prebuilt_masks_match_reference_and_window_attention_is_asked_per_call(attn, monkeypatch):
    """Window forwards get a prebuilt 4D mask (additive for eager, boolean for SDPA); tokens equal the cache-free
    reference. An SDPA model's window forwards ask for the window attention in every attention call, which then
    runs SDPA in grouped-query mode, and the model's `attn_implementation` stays what it was set to."""
    from wedlm_hf.generation import attention

    model = tiny_model("qwen3", seed=5, peak=40, attn=attn)  # 4 query heads on 2 K/V heads
    window_calls, grouped = [], []
    registered = transformers.AttentionInterface._global_mapping["sdpa"]
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def counting(*args, **kwargs):
        window_calls.append((model.config._attn_implementation, kwargs.get(attention.WINDOW_ATTENTION)))
        return registered(*args, **kwargs)

    def counting_sdpa(*args, **kwargs):
        grouped.append(kwargs.get("enable_gqa", False))
        return sdpa(*args, **kwargs)

    monkeypatch.setitem(transformers.AttentionInterface._global_mapping, "sdpa", counting)
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", counting_sdpa)
    input_ids, attention_mask = random_prompts([4, 9], seed=5)
    output = wedlm_generate(model, input_ids, attention_mask, wedlm_entropy_threshold=1.0)
    assert model.config._attn_implementation == attn
    forwards = model.config.num_hidden_layers * output.wedlm_stats.model_calls
    assert window_calls == ([("sdpa", True)] * forwards if attn == "sdpa" else [])
    assert grouped == ([True] * forwards if attn == "sdpa" else [])
    for row in range(2):
        prompt = input_ids[row][attention_mask[row].bool()].tolist()
        expected, _ = reference_decode(model, prompt, MAX_NEW, MASK_ID, [EOS_ID], 16, 1.0, 0.02)
        assert continuation(output, row, input_ids.shape[1]) == expected
