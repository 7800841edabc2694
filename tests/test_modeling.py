"""WeDLM modelling: transformers' Qwen layers, Auto registration, and permutation-aware position ids."""

import json

import pytest
import torch
from tiny_models import MASK_ID, SHAPE, random_prompts, tiny_model
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)
from transformers import masking_utils
from transformers.models.qwen2.modeling_qwen2 import Qwen2DecoderLayer
from transformers.models.qwen3.modeling_qwen3 import Qwen3DecoderLayer
from transformers.testing_utils import CaptureLogger
from transformers.utils import logging as transformers_logging

import wedlm_hf
from wedlm_hf import WeDLMConfig
from wedlm_hf.generation import attention
from wedlm_hf.generation.transformers_version import CACHE_KEYWORD
from wedlm_hf.modeling.configuration_wedlm import QWEN_MASK_TOKEN_ID


@pytest.mark.parametrize("family,layer,reference", [("wedlm", Qwen3DecoderLayer, Qwen3ForCausalLM), ("wedlm-qwen2", Qwen2DecoderLayer, Qwen2ForCausalLM)])
def test_layers_and_weight_names_are_transformers_own(family, layer, reference):
    model = tiny_model(family)
    assert all(type(block) is layer for block in model.model.layers)
    twin = reference(model.config)
    assert set(model.state_dict()) == set(twin.state_dict())
    twin.load_state_dict(model.state_dict())
    input_ids = torch.tensor([[5, 9, 14, 3]])
    assert torch.allclose(model(input_ids).logits, twin.eval()(input_ids).logits, atol=1e-5)


def test_authors_style_config_loads_through_auto_classes(tmp_path):
    model = tiny_model("wedlm-qwen2")
    model.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["model_type"] == "wedlm" and config["qk_norm"] is False and config["mask_token_id"] == MASK_ID
    config.pop("rope_parameters", None)
    config["rope_theta"] = 10000.0  # authors' configs use the flat legacy field
    (tmp_path / "config.json").write_text(json.dumps(config))
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path)
    assert isinstance(loaded, wedlm_hf.WeDLMForCausalLM)
    assert isinstance(AutoConfig.from_pretrained(tmp_path), wedlm_hf.WeDLMConfig)
    input_ids = torch.tensor([[5, 9, 14, 3]])
    assert torch.allclose(loaded(input_ids).logits, model(input_ids).logits, atol=1e-5)


@pytest.mark.parametrize(
    "attention_bias,qwen_config,qwen_class,layer",
    [(True, Qwen2Config, Qwen2ForCausalLM, Qwen2DecoderLayer), (False, Qwen3Config, Qwen3ForCausalLM, Qwen3DecoderLayer)],
)
def test_layout_follows_attention_bias_like_the_authors_engine(tmp_path, attention_bias, qwen_config, qwen_class, layer):
    """A config written the authors' way (`attention_bias`, no `qk_norm`) loads transformers' own Qwen weights."""
    torch.manual_seed(0)
    qwen = qwen_class(qwen_config(**SHAPE, head_dim=16)).eval()
    model = _loaded_as_wedlm(qwen, tmp_path, attention_bias=attention_bias)
    assert model.config.qk_norm is not attention_bias
    assert all(type(block) is layer for block in model.model.layers)
    assert (model.model.layers[0].self_attn.q_proj.bias is not None) is attention_bias

    model.save_pretrained(tmp_path / "again")  # the derived field is written consistently and reloads the same
    reloaded = AutoConfig.from_pretrained(tmp_path / "again")
    assert (reloaded.attention_bias, reloaded.qk_norm) == (attention_bias, not attention_bias)


def _loaded_as_wedlm(qwen, folder, **fields):
    """`qwen` saved by transformers, its config.json rewritten as a WeDLM one (`fields` added, no `qk_norm`),
    loaded through the Auto classes: every weight found with its own shape, and the same logits as `qwen`."""
    qwen.save_pretrained(folder)
    config = json.loads((folder / "config.json").read_text())
    assert "qk_norm" not in config
    config.update(model_type="wedlm", architectures=["WeDLMForCausalLM"], mask_token_id=MASK_ID, **fields)
    (folder / "config.json").write_text(json.dumps(config))
    model, info = AutoModelForCausalLM.from_pretrained(folder, output_loading_info=True)
    assert isinstance(model, wedlm_hf.WeDLMForCausalLM)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    input_ids = torch.tensor([[5, 9, 14, 3]])
    assert torch.equal(model(input_ids).logits, qwen(input_ids).logits)
    return model


def test_config_without_head_dim_takes_hidden_size_over_heads(tmp_path):
    """The authors' configs (and Qwen2's) carry no `head_dim`; Qwen3's default of 128 fits no other size."""
    assert WeDLMConfig(vocab_size=96, hidden_size=64, num_attention_heads=4).head_dim == 16
    assert WeDLMConfig(vocab_size=96, hidden_size=64, num_attention_heads=4, head_dim=32).head_dim == 32
    torch.manual_seed(0)
    qwen2 = Qwen2ForCausalLM(Qwen2Config(**SHAPE)).eval()
    model = _loaded_as_wedlm(qwen2, tmp_path, attention_bias=True)
    assert model.config.head_dim == SHAPE["hidden_size"] // SHAPE["num_attention_heads"] == 16
    assert json.loads((tmp_path / "config.json").read_text()).get("head_dim") is None


def test_contradicting_layout_fields_are_an_error(tmp_path):
    with pytest.raises(ValueError, match="attention_bias=True and qk_norm=True"):
        WeDLMConfig(attention_bias=True, qk_norm=True, vocab_size=96)
    tiny_model("wedlm").config.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "attention_bias": False, "qk_norm": False}))
    with pytest.raises(ValueError, match="attention_bias=False and qk_norm=False"):
        AutoConfig.from_pretrained(tmp_path)


def test_layout_defaults_match_the_authors_config_class():
    assert (WeDLMConfig(vocab_size=96).attention_bias, WeDLMConfig(vocab_size=96).qk_norm) == (True, False)
    assert WeDLMConfig(vocab_size=96, qk_norm=True).attention_bias is False


def test_qwen_vocabulary_without_mask_id_falls_back_to_the_checkpoints_id():
    logger = transformers_logging.get_logger("wedlm_hf.modeling.configuration_wedlm")
    transformers_logging.warning_once.cache_clear()
    with CaptureLogger(logger) as captured:
        configs = [WeDLMConfig(vocab_size=151936, num_hidden_layers=1), WeDLMConfig(vocab_size=152064, num_hidden_layers=1)]
    assert [config.mask_token_id for config in configs] == [QWEN_MASK_TOKEN_ID, QWEN_MASK_TOKEN_ID] == [151665, 151665]
    assert captured.out.count("151665") == 1
    assert WeDLMConfig(vocab_size=151936, mask_token_id=7).mask_token_id == 7


def test_a_config_with_its_mask_id_loads_prints_and_saves_without_the_fallback_warning(tmp_path):
    """transformers 5.19 compared a config with a default-built `WeDLMConfig()` whenever it printed or saved one."""
    logger = transformers_logging.get_logger("wedlm_hf.modeling.configuration_wedlm")
    transformers_logging.warning_once.cache_clear()
    with CaptureLogger(logger) as captured:
        config = AutoConfig.from_pretrained(wedlm_hf.DEFAULT_MODEL)
        config.save_pretrained(tmp_path)
        repr(config)
    assert captured.out == ""


def test_other_vocabulary_without_mask_id_gets_the_clear_error():
    torch.manual_seed(0)
    model = wedlm_hf.WeDLMForCausalLM(WeDLMConfig(**SHAPE, head_dim=16)).eval()
    assert model.config.mask_token_id is None
    input_ids, attention_mask = random_prompts([4])
    with pytest.raises(ValueError, match="mask_token_id"):
        model.generate(input_ids=input_ids, attention_mask=attention_mask, decoding="wedlm", max_new_tokens=4)


def _reordered_window():
    """A committed prefix, then a window fed observed-first: physical order != RoPE order."""
    prefix = [7, 22, 41, 5, 17]
    window_tokens = [30, 44, MASK_ID, MASK_ID]  # slots 1 and 3 observed, 0 and 2 masked
    window_positions = [6, 8, 5, 7]
    return prefix, window_tokens, window_positions


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_reordered_forward_with_mask_equals_cached(attn):
    """A reordered window is one sequence whether it continues a cache or carries an explicit mask."""
    model = tiny_model("wedlm", attn=attn)
    prefix, window_tokens, window_positions = _reordered_window()
    ids = torch.tensor([prefix + window_tokens])
    positions = torch.tensor([list(range(len(prefix))) + window_positions])
    no_cache = model(input_ids=ids, position_ids=positions, attention_mask=torch.ones_like(ids), use_cache=False)

    cache = {CACHE_KEYWORD: wedlm_hf.WeDLMCache(key_mask=torch.ones(1, 0, dtype=torch.bool))}
    model(input_ids=ids[:, : len(prefix)], position_ids=positions[:, : len(prefix)], use_cache=True, **cache)
    cached = model(
        input_ids=ids[:, len(prefix) :], position_ids=positions[:, len(prefix) :], use_cache=True, **cache
    ).logits[0]
    assert torch.allclose(no_cache.logits[0, len(prefix) :], cached, atol=1e-5)


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
@pytest.mark.parametrize(
    "options", [{}, {"wedlm_lossless": True, "wedlm_draft_schedule": "full"}, {"wedlm_static": True}]
)
def test_decoding_forwards_never_reach_the_packed_sequence_check(monkeypatch, attn, options):
    """The pitfall is real (transformers splits a reordered window fed without mask or cache, see
    test_modeling_conformance.py); WeDLM decoding never feeds one, so the model classes can keep packing."""

    def packed_check(position_ids):
        raise AssertionError(f"a decoding forward was read as packed sequences: {position_ids.tolist()}")

    monkeypatch.setattr(masking_utils, "find_packed_sequence_indices", packed_check)
    model = tiny_model("wedlm", peak=40, attn=attn)
    input_ids, attention_mask = random_prompts([6])
    output = model.generate(
        input_ids=input_ids, attention_mask=attention_mask, decoding="wedlm", max_new_tokens=12,
        return_dict_in_generate=True, **options,
    )
    stats = output.wedlm_stats
    assert stats.processed[0] > 2 * stats.model_calls, "the test needs forwards wider than one token"
    fill_steps = stats.fill_steps[0]
    assert options.get("wedlm_lossless") or fill_steps != sorted(fill_steps), "and windows fed out of slot order"


def test_flash_attention_gets_explicit_sequence_lengths(monkeypatch):
    """Under FlashAttention every decoding forward carries cu_seq_lens, so no packing is ever inferred."""
    model = tiny_model("wedlm", peak=40)
    monkeypatch.setattr(attention, "uses_flash_attention", lambda config: True)
    seen = []
    model.model.register_forward_pre_hook(
        lambda module, args, kwargs: seen.append({**kwargs, "past": kwargs[CACHE_KEYWORD].get_seq_length()}),
        with_kwargs=True,
    )
    input_ids, attention_mask = random_prompts([6])
    model.generate(input_ids=input_ids, attention_mask=attention_mask, decoding="wedlm", max_new_tokens=8)
    assert seen
    for kwargs in seen:
        query, past = kwargs["input_ids"].shape[1], kwargs["past"]
        assert kwargs["cu_seq_lens_q"].tolist() == [0, query]
        assert kwargs["max_length_k"] == past + query
        assert kwargs["attention_mask"] is not None
