"""Which transformers families WeDLM drives: each one the capability check admits decodes exactly like the
cache-free reference; each one it refuses gets an error naming what it lacks."""

import pytest
import torch
from tiny_models import EOS_ID, MASK_ID, SHAPE, random_prompts, tiny_family_model
from transformers import AutoConfig, AutoModelForCausalLM, T5Config, T5ForConditionalGeneration

import wedlm_hf
from wedlm_hf.generation.reference import reference_decode
from wedlm_hf.generation.transformers_version import INSTALLED

MAX_NEW = 16
WINDOW = 4
THRESHOLD = 2.0
_MLA = dict(num_key_value_heads=4, q_lora_rank=32, kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=16)
_MOE = dict(num_experts_per_tok=2, moe_intermediate_size=32)

# model_type -> config overrides keeping it tiny and in a full-attention, all-RoPE layout
ADMITTED = {
    "llama": {},
    "mistral": dict(sliding_window=None),
    "mixtral": dict(num_local_experts=4),
    "qwen2": {},
    "qwen2_moe": dict(num_experts=4, shared_expert_intermediate_size=32, **_MOE),
    "qwen3": dict(head_dim=16),
    "qwen3_moe": dict(num_experts=4, head_dim=16, **_MOE),
    "gemma": dict(head_dim=16),  # embeddings scaled by sqrt(hidden_size)
    "phi": {},  # partial rotary
    "phi3": dict(sliding_window=None),
    "olmo": {},
    "olmo2": {},  # q/k norm over all heads
    "olmoe": dict(num_experts=4, num_experts_per_tok=2),
    "granite": dict(embedding_multiplier=2.0, attention_multiplier=0.2, residual_multiplier=0.5, logits_scaling=2.0),
    "granitemoe": dict(num_local_experts=4, num_experts_per_tok=2),
    "cohere": dict(logit_scale=1.0),  # parallel attention/MLP, interleaved rotary
    "starcoder2": dict(sliding_window=None),
    "stablelm": {},
    "gpt_neox": {},
    "gptj": dict(rotary_dim=8),
    "falcon": dict(alibi=False),
    "persimmon": {},
    "glm": {},
    "glm4": {},
    "nemotron": {},
    "helium": dict(head_dim=16),
    "ernie4_5": {},
    "smollm3": {},  # two layers: both under RoPE (its NoPE layers start at the fourth)
    "deepseek_v3": dict(n_routed_experts=4, n_group=1, topk_group=1, first_k_dense_replace=1, **_MLA, **_MOE),
    "minicpm3": _MLA,
    "diffllama": {},
    "seed_oss": {},
}


@pytest.mark.parametrize("model_type", sorted(ADMITTED))
def test_admitted_family_decodes_like_the_cache_free_reference(model_type):
    if model_type == "gptj" and INSTALLED < (5, 24):
        pytest.skip("GPT-J rotates inside its own attention before transformers 5.24, refused there (test below)")
    model = wedlm_hf.enable(tiny_family_model(model_type, **ADMITTED[model_type]))
    input_ids, attention_mask = random_prompts([5, 9], seed=1)
    output = model.generate(
        input_ids=input_ids, attention_mask=attention_mask, decoding="wedlm", mask_token_id=MASK_ID,
        max_new_tokens=MAX_NEW, wedlm_window_size=WINDOW, wedlm_entropy_threshold=THRESHOLD,
        return_dict_in_generate=True,
    )
    stats = output.wedlm_stats
    for row in range(2):
        prompt = input_ids[row][attention_mask[row].bool()].tolist()
        expected, forwards = reference_decode(model, prompt, MAX_NEW, MASK_ID, [EOS_ID], WINDOW, THRESHOLD, 0.02)
        assert output.sequences[row, input_ids.shape[1] :].tolist()[: stats.generated[row]] == expected
        assert stats.forwards[row] == forwards
    assert sum(stats.generated) > sum(stats.forwards)  # some steps filled several slots in parallel


def _on_meta(model_type: str, **overrides):
    """The refusal reads config and modules only, so the model need not hold weights."""
    config = AutoConfig.for_model(model_type, **{**SHAPE, **overrides})
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config)


@pytest.mark.parametrize(
    "model_type,overrides,reason",
    [
        ("mistral", dict(sliding_window=64), r"sliding-window attention \(config.sliding_window=64\)"),
        ("phi3", dict(sliding_window=64), r"config.sliding_window=64"),
        ("qwen2", dict(use_sliding_window=True, sliding_window=64, max_window_layers=0), "'sliding_attention' layers"),
        ("gemma2", dict(head_dim=16), "config.layer_types has 'sliding_attention' layers"),
        ("gemma3_text", dict(head_dim=16), "'sliding_attention' layers"),
        ("cohere2", {}, "'sliding_attention' layers"),
        ("llama4_text", dict(head_dim=16, num_local_experts=2, intermediate_size_mlp=128), "'chunked_attention'"),
        ("smollm3", dict(num_hidden_layers=4), r"layers \[3\] use no position embedding \(NoPE"),
        ("falcon", dict(alibi=True), "ALiBi"),
        ("mpt", dict(d_model=64, n_heads=4, n_layers=2), "ALiBi"),
        ("bloom", dict(n_layer=2, n_head=4), "no rotary position embedding"),
        ("gpt2", dict(n_embd=64, n_layer=2, n_head=4), "no rotary position embedding"),
        ("opt", dict(ffn_dim=128), "no rotary position embedding"),
        ("jamba", dict(num_experts=2, attn_layer_period=2, attn_layer_offset=1), "no rotary position embedding"),
        ("bamba", dict(attn_layer_indices=[1]), "'linear_attention' layers"),
    ],
)
def test_refused_family_says_what_it_lacks(model_type, overrides, reason):
    model = _on_meta(model_type, **overrides)
    with pytest.raises(ValueError, match=f"WeDLM decoding cannot drive .*{reason}"):
        wedlm_hf.enable(model)


@pytest.mark.skipif(INSTALLED >= (5, 24), reason="transformers 5.24 gave GPT-J and CodeGen a RoPE module")
@pytest.mark.parametrize("model_type", ["gptj", "codegen"])
def test_rope_inside_attention_is_refused_before_transformers_5_24(model_type):
    with pytest.raises(ValueError, match=r"a sin/cos table of its own; run `pip install 'transformers>=5.24'`"):
        wedlm_hf.enable(_on_meta(model_type))


def test_encoder_decoder_is_refused():
    with torch.device("meta"):
        t5 = T5ForConditionalGeneration(T5Config(vocab_size=96, d_model=32, d_ff=64, num_layers=1, num_heads=2))
    with pytest.raises(ValueError, match="encoder-decoder"):
        wedlm_hf.enable(t5)


def test_sliding_window_removed_is_admitted():
    """The error's suggested fix works: without the window, Mistral is a full-attention RoPE model."""
    model = _on_meta("mistral", sliding_window=64)
    model.config.sliding_window = None
    assert wedlm_hf.enable(model) is model


def test_model_without_a_croppable_cache_is_refused():
    model = _on_meta("llama")
    model._is_stateful = True  # as transformers marks recurrent-state models
    with pytest.raises(ValueError, match="recurrent state rather than a transformers `Cache`"):
        wedlm_hf.enable(model)


def test_forward_missing_an_argument_the_loop_passes_is_refused():
    llama_class = type(_on_meta("llama"))

    class NoLogitsToKeep(llama_class):
        def forward(self, input_ids=None, attention_mask=None, position_ids=None, cache=None, past_key_values=None,
                    **kwargs):  # the cache by either name: transformers 5.24 renamed `past_key_values` to `cache`
            return super().forward(input_ids, attention_mask, position_ids, cache or past_key_values, **kwargs)

    with torch.device("meta"):
        model = NoLogitsToKeep(AutoConfig.for_model("llama", **SHAPE))
    with pytest.raises(ValueError, match="forward takes no `logits_to_keep`"):
        wedlm_hf.enable(model)
