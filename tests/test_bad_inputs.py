"""Every row of the bad-input table (docs/options.md): a clear error or the documented behaviour, never a shape error."""

import copy

import pytest
import torch
from tiny_models import EOS_ID, MASK_ID, PAD_ID, random_prompts, tiny_model
from transformers import DynamicCache

import wedlm_hf
from wedlm_hf.generation.reference import reference_decode
from wedlm_hf.generation.transformers_version import CACHE_KEYWORD


@pytest.fixture(scope="module")
def model():
    return tiny_model("wedlm", peak=40)


def generate(model, input_ids, attention_mask=None, **kwargs):
    options = dict(decoding="wedlm", max_new_tokens=8, return_dict_in_generate=True)
    options.update(kwargs)
    return model.generate(input_ids=input_ids, attention_mask=attention_mask, **options)


def test_empty_prompt(model):
    with pytest.raises(ValueError, match="at least one prompt token"):
        generate(model, torch.zeros(1, 0, dtype=torch.long))


def test_all_padding_row(model):
    input_ids, attention_mask = random_prompts([4, 3])
    attention_mask[1] = 0
    with pytest.raises(ValueError, match=r"Rows \[1\].*all padding"):
        generate(model, input_ids, attention_mask)


def test_prompt_at_max_positions(model):
    limit = model.config.max_position_embeddings
    input_ids = torch.full((1, limit), 7)
    with pytest.raises(ValueError, match="max_position_embeddings"):
        generate(model, input_ids)


def test_max_new_tokens_zero_is_refused_by_transformers(model):
    input_ids, attention_mask = random_prompts([4])
    with pytest.raises(ValueError, match="max_new_tokens"):
        generate(model, input_ids, attention_mask, max_new_tokens=0)


def test_prompt_containing_mask_token_is_an_observed_token(model):
    input_ids = torch.tensor([[12, MASK_ID, 40, MASK_ID]])
    output = generate(model, input_ids, max_new_tokens=10)
    expected, _ = reference_decode(model, input_ids[0].tolist(), 10, MASK_ID, [EOS_ID])
    assert output.sequences[0, 4 : 4 + len(expected)].tolist() == expected


@pytest.mark.parametrize("special", ["eos_token_id", "pad_token_id"])
def test_mask_id_equal_to_eos_or_pad(model, special):
    input_ids, attention_mask = random_prompts([4])
    kwargs = {special: MASK_ID}
    if special == "pad_token_id":
        kwargs["eos_token_id"] = EOS_ID
    with pytest.raises(ValueError, match=special):
        generate(model, input_ids, attention_mask, **kwargs)


def test_window_larger_than_max_new_tokens_is_clipped(model):
    input_ids, attention_mask = random_prompts([5])
    output = generate(model, input_ids, attention_mask, wedlm_window_size=64, max_new_tokens=5)
    assert output.wedlm_stats.processed[0] <= 5 * output.wedlm_stats.forwards[0]
    expected, _ = reference_decode(model, input_ids[0].tolist(), 5, MASK_ID, [EOS_ID], window_size=64)
    assert output.sequences[0, 5:].tolist()[: len(expected)] == expected


@pytest.mark.parametrize(
    "kwargs,name",
    [
        ({"wedlm_window_size": "8"}, "wedlm_window_size"),
        ({"wedlm_window_size": -3}, "wedlm_window_size"),
        ({"wedlm_entropy_threshold": "high"}, "wedlm_entropy_threshold"),
        ({"wedlm_pos_penalty_factor": -0.5}, "wedlm_pos_penalty_factor"),
        ({"mask_token_id": 3.5}, "mask_token_id"),
        ({"wedlm_lossless": "yes"}, "wedlm_lossless"),
    ],
)
def test_non_integer_or_negative_parameters(model, kwargs, name):
    input_ids, attention_mask = random_prompts([4])
    with pytest.raises(ValueError, match=name):
        generate(model, input_ids, attention_mask, **kwargs)


def test_beam_search_is_refused(model):
    input_ids, attention_mask = random_prompts([4])
    with pytest.raises(ValueError, match="num_beams"):
        generate(model, input_ids, attention_mask, num_beams=3)


def test_assistant_model_is_refused(model):
    input_ids, attention_mask = random_prompts([4])
    with pytest.raises(ValueError, match="assistant_model"):
        generate(model, input_ids, attention_mask, assistant_model=tiny_model("wedlm", seed=1))


def test_right_padded_batch(model):
    input_ids, attention_mask = random_prompts([4, 2])
    right_ids = torch.stack([input_ids[0], torch.cat([input_ids[1, 2:], torch.full((2,), PAD_ID)])])
    right_mask = torch.stack([attention_mask[0], torch.tensor([1, 1, 0, 0])])
    with pytest.raises(ValueError, match="padding_side = 'left'"):
        generate(model, right_ids, right_mask)


def test_inputs_embeds_only(model):
    embeds = model.get_input_embeddings()(torch.tensor([[5, 6, 7]]))
    with pytest.raises(ValueError, match="inputs_embeds"):
        model.generate(inputs_embeds=embeds, decoding="wedlm", max_new_tokens=4)


def test_cache_from_an_earlier_call(model):
    input_ids, attention_mask = random_prompts([4])
    cache = {CACHE_KEYWORD: DynamicCache()}
    model(input_ids=input_ids, use_cache=True, **cache)
    with pytest.raises(ValueError, match="full sequence"):
        generate(model, input_ids, attention_mask, **cache)


def test_custom_generate_together_with_decoding(model):
    input_ids, attention_mask = random_prompts([4])
    with pytest.raises(ValueError, match="custom_generate"):
        generate(model, input_ids, attention_mask, custom_generate=wedlm_hf.wedlm_decode)


UNHONOURED = [
    ({"prompt_lookup_num_tokens": 3}, "prompt_lookup_num_tokens"),
    ({"output_hidden_states": True}, "output_hidden_states"),
    ({"output_attentions": True}, "output_attentions"),
    ({"cache_implementation": "offloaded"}, "cache_implementation"),  # "static" selects the static-shape path
    ({"cache_implementation": "paged"}, "cache_implementation"),  # transformers would switch to continuous batching
    ({"use_cache": False}, "use_cache=False"),
    ({"penalty_alpha": 0.6, "top_k": 4}, "penalty_alpha"),  # contrastive search
    ({"dola_layers": "high"}, "dola_layers"),
    ({"force_words_ids": [[5]]}, "force_words_ids"),  # constrained beam search
]


@pytest.mark.parametrize("kwargs,name", UNHONOURED, ids=lambda v: str(v))
def test_options_wedlm_cannot_honour_are_refused(model, kwargs, name):
    input_ids, attention_mask = random_prompts([4])
    with pytest.raises(ValueError, match=name):
        generate(model, input_ids, attention_mask, **kwargs)


@pytest.mark.parametrize(
    "kwargs,name", [case for case in UNHONOURED if case[0] != {"cache_implementation": "paged"}], ids=lambda v: str(v)
)
def test_options_wedlm_cannot_honour_are_refused_by_the_callable(kwargs, name):
    """The `custom_generate=wedlm_decode` route (no `enable`) refuses them too, from the merged generation config."""
    model = tiny_model("llama", peak=40)
    input_ids, attention_mask = random_prompts([4])
    with pytest.raises(ValueError, match=name):
        model.generate(
            input_ids=input_ids,
            attention_mask=attention_mask,
            custom_generate=wedlm_hf.wedlm_decode,
            mask_token_id=MASK_ID,
            max_new_tokens=4,
            **kwargs,
        )


def test_options_wedlm_cannot_honour_in_a_generation_config(model):
    input_ids, attention_mask = random_prompts([4])
    config = copy.deepcopy(model.generation_config)
    config.output_hidden_states = True
    with pytest.raises(ValueError, match="output_hidden_states"):
        generate(model, input_ids, attention_mask, generation_config=config)


def test_cache_implementation_from_the_generation_config_can_be_overridden(model):
    input_ids, attention_mask = random_prompts([4])
    config = copy.deepcopy(model.generation_config)
    config.cache_implementation = "offloaded"
    with pytest.raises(ValueError, match="cache_implementation=None"):
        generate(model, input_ids, attention_mask, generation_config=config)
    out = generate(model, input_ids, attention_mask, generation_config=config, cache_implementation=None)
    assert torch.equal(out.sequences, generate(model, input_ids, attention_mask).sequences)
