"""Bad requests fail early with an error naming the parameter and the fix."""

import pytest
import torch
from tiny_models import MASK_ID, VOCAB, random_prompts, tiny_model
from transformers import GenerationConfig, GenerationMixin, GPT2Config, GPT2LMHeadModel

import wedlm_hf
from wedlm_hf.generation.settings import WeDLMSettings


@pytest.fixture(scope="module")
def model():
    return tiny_model("wedlm", peak=40)


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"wedlm_window_size": 0}, "wedlm_window_size"),
        ({"wedlm_window_size": 2.5}, "wedlm_window_size"),
        ({"wedlm_entropy_threshold": -0.1}, "wedlm_entropy_threshold"),
        ({"wedlm_pos_penalty_factor": -1.0}, "wedlm_pos_penalty_factor"),
        ({"mask_token_id": VOCAB}, "mask_token_id"),
        ({"mask_token_id": -1}, "mask_token_id"),
        ({"num_beams": 2}, "num_beams"),
        ({"decoding": "beam"}, "decoding"),
    ],
)
def test_bad_parameters_are_named(model, kwargs, message):
    input_ids, attention_mask = random_prompts([4])
    options = dict(decoding="wedlm", max_new_tokens=4)
    options.update(kwargs)
    with pytest.raises(ValueError, match=message):
        model.generate(input_ids=input_ids, attention_mask=attention_mask, **options)


def test_missing_mask_id_says_how_to_fix():
    model = wedlm_hf.enable(tiny_model("llama"))
    input_ids, attention_mask = random_prompts([4])
    with pytest.raises(ValueError, match="mask_token_id"):
        model.generate(input_ids=input_ids, attention_mask=attention_mask, decoding="wedlm", max_new_tokens=4)


def test_mask_id_from_generation_config(model):
    input_ids, attention_mask = random_prompts([4])
    llama = wedlm_hf.enable(tiny_model("llama"))
    llama.generation_config.mask_token_id = MASK_ID
    llama.generation_config.wedlm_window_size = 2
    output = llama.generate(
        input_ids=input_ids, attention_mask=attention_mask, decoding="wedlm", max_new_tokens=6, return_dict_in_generate=True
    )
    assert max(output.wedlm_stats.processed) <= 6 * 4


def test_unsupported_architecture_says_why():
    torch.manual_seed(0)
    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=1, n_head=2))
    with pytest.raises(ValueError, match="GPT2LMHeadModel .* no rotary position embedding"):
        wedlm_hf.enable(gpt2)
    with pytest.raises(ValueError, match="WeDLM decoding cannot drive"):
        gpt2.generate(
            input_ids=torch.tensor([[5, 6]]), custom_generate=wedlm_hf.wedlm_decode, mask_token_id=3, max_new_tokens=2
        )


def test_sliding_window_model_is_refused():
    mistral = tiny_model("mistral")
    mistral.config.sliding_window = 64
    with pytest.raises(ValueError, match="sliding_window"):
        wedlm_hf.enable(mistral)


def test_lossless_drafts_every_mask_unless_a_threshold_is_passed():
    """A checkpoint's threshold is tuned for committing; lossless mode drafts every mask by default."""
    config = GenerationConfig(wedlm_entropy_threshold=1.0, mask_token_id=MASK_ID)
    model_config = tiny_model("wedlm").config

    def resolve(**kwargs):
        return WeDLMSettings.resolve(config, model_config, VOCAB, **kwargs).entropy_threshold

    assert resolve() == 1.0
    assert resolve(wedlm_lossless=True) == float("inf")
    assert resolve(wedlm_lossless=True, wedlm_entropy_threshold=0.5) == 0.5


@pytest.fixture(scope="module")
def wedlm_by_default():
    """A model whose generation config selects WeDLM, as the embedded checkpoint's does."""
    model = tiny_model("wedlm", peak=40)
    model.generation_config.decoding = "wedlm"
    model.generation_config.mask_token_id = MASK_ID
    return model


@pytest.mark.parametrize(
    "kwargs,name",
    [
        ({"num_beams": 2}, "num_beams"),
        ({"assistant_model": "draft"}, "assistant_model"),
        ({"prompt_lookup_num_tokens": 3}, "prompt_lookup_num_tokens"),
        ({"use_cache": False}, "use_cache"),
    ],
)
def test_config_selected_wedlm_errors_point_at_decoding_ar(wedlm_by_default, kwargs, name):
    input_ids, attention_mask = random_prompts([4])
    if kwargs.get("assistant_model") == "draft":
        kwargs = {"assistant_model": tiny_model("wedlm", seed=1)}
    with pytest.raises(ValueError, match=name) as from_config:
        wedlm_by_default.generate(input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=4, **kwargs)
    assert "decoding='ar'" in str(from_config.value)
    with pytest.raises(ValueError, match=name) as from_call:  # asked for WeDLM explicitly: no hint to switch
        wedlm_by_default.generate(
            input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=4, decoding="wedlm", **kwargs
        )
    assert "decoding='ar'" not in str(from_call.value)


def test_decoding_ar_on_a_wedlm_by_default_model_takes_beam_search(wedlm_by_default):
    input_ids, attention_mask = random_prompts([4])
    out = wedlm_by_default.generate(
        input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=4, decoding="ar", num_beams=2
    )
    assert out.shape == (1, 8)


def test_decoding_is_case_insensitive(model):
    input_ids, attention_mask = random_prompts([4, 2])
    options = dict(input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=8)
    wedlm = model.generate(decoding="wedlm", **options, mask_token_id=MASK_ID, return_dict_in_generate=True)
    upper = model.generate(decoding="WeDLM", **options, mask_token_id=MASK_ID, return_dict_in_generate=True)
    assert torch.equal(wedlm.sequences, upper.sequences) and upper.wedlm_stats is not None
    assert torch.equal(model.generate(decoding="AR", **options), model.generate(decoding="ar", **options))


def test_plain_model_given_decoding_is_refused_and_import_changes_no_transformers_class():
    """`import wedlm_hf` leaves transformers' classes alone, so a model never enabled refuses `decoding` with
    transformers' own error (docs/options.md's bad-input table points at `wedlm_hf.enable`); an enabled one decodes."""
    assert "wedlm" not in GenerationMixin._validate_model_kwargs.__module__
    model = tiny_model("llama")  # loaded, never enabled
    input_ids, attention_mask = random_prompts([4])
    with pytest.raises(ValueError, match=r"not used by the model: \['decoding'\]"):
        model.generate(input_ids=input_ids, attention_mask=attention_mask, decoding="wedlm", max_new_tokens=4)
    output = wedlm_hf.enable(model).generate(
        input_ids=input_ids, attention_mask=attention_mask, decoding="wedlm", max_new_tokens=4, wedlm_lossless=True,
        mask_token_id=MASK_ID,
    )
    assert output.shape == (1, 8)
