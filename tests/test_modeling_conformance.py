"""WeDLM's model classes behave as transformers' own Qwen2/Qwen3 classes do for callers other than the decoder:
the attention implementation asked for, the deprecated `past_key_values` name, padding-free packed batches, and
tensor-parallel plans."""

import pytest
import torch
from test_decoding import MAX_NEW, continuation, wedlm_generate
from tiny_models import EOS_ID, MASK_ID, random_prompts, tiny_model
from transformers import AutoModelForCausalLM, DataCollatorWithFlattening, DynamicCache
from transformers.distributed import tensor_parallel
from transformers.testing_utils import CaptureLogger
from transformers.utils import logging

import wedlm_hf
from wedlm_hf import WeDLMConfig
from wedlm_hf.generation.attention import WINDOW_ATTENTION, window_attention_kwargs
from wedlm_hf.generation.reference import reference_decode
from wedlm_hf.generation.transformers_version import INSTALLED

LAYOUTS = ["wedlm", "wedlm-qwen2"]
SEQUENCES = [[5, 9, 14, 3, 7, 22], [11, 12, 13], [40, 41, 42, 43]]


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
@pytest.mark.parametrize("family", ["wedlm", "wedlm-qwen2", "llama", "qwen3"])
def test_attn_implementation_reads_back_as_asked_and_decoding_stays_wedlm(family, attn, tmp_path):
    """`from_pretrained(..., attn_implementation=...)` reads back as asked (the config and every attention
    module's), for WeDLM models and stock Llama and Qwen3 models enabled for WeDLM, before and after WeDLM
    decoding; SDPA window forwards still ask for the window attention, and the tokens are the cache-free
    reference's."""
    tiny_model(family, seed=7, peak=40).save_pretrained(tmp_path)
    model = wedlm_hf.enable(AutoModelForCausalLM.from_pretrained(tmp_path, attn_implementation=attn))

    def read_back() -> set:
        configs = [model.config] + [m.config for m in model.modules() if type(m).__name__.endswith("Attention")]
        return {value for c in configs for value in (c._attn_implementation, c._attn_implementation_internal)}

    assert read_back() == {attn}
    assert window_attention_kwargs(model) == ({WINDOW_ATTENTION: True} if attn == "sdpa" else {})
    input_ids, attention_mask = random_prompts([5, 9], seed=7)
    output = wedlm_generate(model, input_ids, attention_mask, wedlm_entropy_threshold=1.0)
    assert read_back() == {attn}
    for row in range(2):
        prompt = input_ids[row][attention_mask[row].bool()].tolist()
        expected, _ = reference_decode(model, prompt, MAX_NEW, MASK_ID, [EOS_ID], 16, 1.0, 0.02)
        assert continuation(output, row, input_ids.shape[1]) == expected


@pytest.mark.skipif(INSTALLED < (5, 24), reason="transformers 5.24 renamed `past_key_values` to `cache`")
@pytest.mark.parametrize("family", LAYOUTS)
def test_past_key_values_continues_a_filled_cache(family):
    """`past_key_values=` (the name transformers still accepts for `cache`) continues the cache it is given."""
    model = tiny_model(family)
    ids = torch.tensor([SEQUENCES[0]])
    full = model.model(input_ids=ids, use_cache=False).last_hidden_state
    cache = DynamicCache(config=model.config)
    model.model(input_ids=ids[:, :4], cache=cache, use_cache=True)
    with pytest.warns(FutureWarning, match="past_key_values"):
        continued = model.model(input_ids=ids[:, 4:], past_key_values=cache, use_cache=True)
    assert torch.allclose(continued.last_hidden_state, full[:, 4:], atol=1e-5)
    assert continued.cache is cache and cache.get_seq_length() == ids.shape[1]

    cache = DynamicCache(config=model.config)
    model(input_ids=ids[:, :4], cache=cache, use_cache=True)
    with pytest.warns(FutureWarning, match="past_key_values"):
        logits = model(input_ids=ids[:, 4:], past_key_values=cache, use_cache=True).logits
    assert torch.allclose(logits, model(input_ids=ids, use_cache=False).logits[:, 4:], atol=1e-5)


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
@pytest.mark.parametrize("family", LAYOUTS)
def test_packed_batch_from_data_collator_with_flattening_keeps_sequences_apart(family, attn):
    """A padding-free batch (one row, position ids restarting at each sequence, no mask) gives each sequence the
    logits and loss it gets alone. `use_cache=False` as in training: with a cache transformers reads no packing."""
    model = tiny_model(family, attn=attn)
    batch = DataCollatorWithFlattening()([{"input_ids": ids} for ids in SEQUENCES])
    assert "attention_mask" not in batch and batch["input_ids"].shape[0] == 1
    packed = model(**batch, use_cache=False)
    alone = [model(input_ids=torch.tensor([ids]), labels=torch.tensor([ids]), use_cache=False) for ids in SEQUENCES]
    assert torch.allclose(packed.logits[0], torch.cat([output.logits[0] for output in alone]), atol=1e-5)
    predicted = [len(ids) - 1 for ids in SEQUENCES]
    mean_loss = sum(output.loss * count for output, count in zip(alone, predicted)) / sum(predicted)
    assert torch.allclose(packed.loss, mean_loss, atol=1e-5)


@pytest.mark.parametrize("attention_bias", [True, False])
def test_tensor_parallel_plan_names_only_modules_the_layout_has(attention_bias):
    """WeDLM-7B's layout (q/k/v bias, no q/k norm) gets Qwen2's plan; transformers' own plan check finds every rule
    applied and every projection sharded."""
    config = WeDLMConfig(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, attention_bias=attention_bias)
    norms = {"layers.*.self_attn.q_norm", "layers.*.self_attn.k_norm"}
    assert norms.isdisjoint(config.base_model_tp_plan) if attention_bias else norms <= set(config.base_model_tp_plan)
    assert "base_model_tp_plan" not in config.to_dict()

    model = tiny_model("wedlm-qwen2" if attention_bias else "wedlm")
    with CaptureLogger(logging.get_logger(tensor_parallel.__name__)) as captured:
        tensor_parallel.verify_tp_plan(list(model.state_dict()), model.tp_plan)
    assert "were not applied" not in captured.out, captured.out
    unsharded = captured.out.partition("were not sharded:")[2]
    assert "proj" not in unsharded and "lm_head" not in unsharded, unsharded
    assert "embed_tokens" not in unsharded or INSTALLED < (5, 21), unsharded  # 5.21 shards untied embeddings too
