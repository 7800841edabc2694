"""Draft-only adapters (`wedlm_hf.draft_adapter`): the base model stays itself at every observed token, so lossless
decoding with the adapter is the base model's greedy `generate()`; proved against the base with the adapter disabled."""

import json

import pytest
import torch
from transformers import AutoModelForCausalLM

peft = pytest.importorskip("peft")

import wedlm_hf  # noqa: E402
from tiny_models import MASK_ID, random_prompts, tiny_model  # noqa: E402
from wedlm_hf.draft_adapter import (  # noqa: E402
    MERGE_REFUSED,
    draft_only_lora_config,
    draft_only_mask_id,
    gate_draft_only_adapters,
    linear_module_names,
)
from wedlm_hf.training import DualStreamCollator  # noqa: E402
from wedlm_hf.training.draft_objective import draft_only_forward  # noqa: E402
from wedlm_hf.training.objective import dual_stream_forward  # noqa: E402

FAMILIES = ("llama", "qwen3")


def adapted(family: str, gated: bool = True, seed: int = 1):
    """A tiny `family` model with a draft-only adapter whose B matrices are random (PEFT starts them at zero, which
    would make every check below pass trivially)."""
    base = tiny_model(family)
    model = peft.get_peft_model(base, draft_only_lora_config(4, 8, linear_module_names(base), MASK_ID))
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "lora_B" in name:
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.5)
    if gated:
        gate_draft_only_adapters(model)
    return model.eval()


def window_batch():
    """Left-padded prompts followed by four mask slots, as a WeDLM window forward feeds them."""
    ids, attention = random_prompts([7, 5], seed=3)
    masks = torch.full((2, 4), MASK_ID)
    return torch.cat([ids, masks], 1), torch.cat([attention, torch.ones_like(masks)], 1), ids.shape[1]


@pytest.mark.parametrize("family", FAMILIES)
def test_observed_tokens_keep_the_base_models_logits_and_cache(family):
    model = adapted(family)
    ids, attention, observed = window_batch()
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=attention, use_cache=True)
        with model.disable_adapter():
            base = model(input_ids=ids, attention_mask=attention, use_cache=True)
    assert torch.equal(out.logits[:, :observed], base.logits[:, :observed])
    for layer, base_layer in zip(out.past_key_values.layers, base.past_key_values.layers):
        assert torch.equal(layer.keys[:, :, :observed], base_layer.keys[:, :, :observed])
        assert torch.equal(layer.values[:, :, :observed], base_layer.values[:, :, :observed])
    assert (out.logits[:, observed:] - base.logits[:, observed:]).abs().max() > 0.1  # the adapter drafts
    ungated = adapted(family, gated=False)  # the same weights on every token: the check above can fail
    with torch.no_grad():
        assert not torch.equal(ungated(input_ids=ids, attention_mask=attention).logits[:, :observed], base.logits[:, :observed])


def test_a_forward_without_mask_slots_skips_the_adapter():
    model = adapted("llama")
    calls = []
    layers = [module for module in model.modules() if isinstance(module, peft.tuners.lora.layer.Linear)]
    for module in layers:
        module.lora_A["default"].register_forward_hook(lambda *args: calls.append(1))
    ids, attention = random_prompts([6, 4], seed=5)
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=attention).logits
        with model.disable_adapter():
            base = model(input_ids=ids, attention_mask=attention).logits
        assert calls == []
        model(input_ids=torch.full((1, 2), MASK_ID))
    assert torch.equal(out, base) and len(calls) == len(layers) == 7 * 2  # 7 projections in each of 2 layers


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("schedule", ["adaptive", "full"])
def test_lossless_with_the_adapter_is_the_base_models_greedy_generate(family, schedule):
    model = adapted(family)
    wedlm_hf.enable(model)  # a PeftModel: the gate stays on, the transformers model inside is enabled
    ids, attention = random_prompts([9, 4, 6], seed=7)
    with torch.no_grad():
        out = model.generate(
            input_ids=ids, attention_mask=attention, decoding="wedlm", wedlm_lossless=True,
            wedlm_draft_schedule=schedule, max_new_tokens=24, return_dict_in_generate=True,
        )
        with model.disable_adapter():
            greedy = model.generate(input_ids=ids, attention_mask=attention, max_new_tokens=24, do_sample=False)
        alone = model.generate(
            input_ids=ids[1:2, -4:], attention_mask=attention[1:2, -4:], decoding="wedlm", wedlm_lossless=True,
            wedlm_draft_schedule=schedule, max_new_tokens=24,
        )
    assert torch.equal(out.sequences, greedy)
    assert torch.equal(alone, greedy[1:2, -28:])  # batched == unbatched
    assert out.wedlm_stats.summary()["drafted"] > 0


def test_merging_a_draft_only_adapter_is_refused():
    model = adapted("llama")
    with pytest.raises(ValueError, match="draft-only adapter cannot be merged"):
        model.merge_and_unload()
    assert "cannot be merged" in MERGE_REFUSED


def test_the_marker_survives_peft_save_and_load(tmp_path):
    model = adapted("llama", gated=False)
    model.save_pretrained(tmp_path)
    assert draft_only_mask_id(json.loads((tmp_path / "adapter_config.json").read_text())) == MASK_ID
    loaded = peft.PeftModel.from_pretrained(tiny_model("llama"), tmp_path)
    assert draft_only_mask_id(loaded.peft_config["default"]) == MASK_ID
    assert draft_only_mask_id(peft.LoraConfig(target_modules=["q_proj"])) is None


@pytest.mark.parametrize("family", FAMILIES)
def test_draft_only_training_forward_equals_the_joint_forward_without_ar_loss(family):
    model = adapted(family).train()
    collator = DualStreamCollator(MASK_ID, block_size=8, ar_weight=0.0, seed=0)
    generator = torch.Generator().manual_seed(2)
    batch = collator([{"input_ids": torch.randint(3, MASK_ID, (24,), generator=generator)} for _ in range(3)])
    grad_seen = []
    decoder = model.get_base_model().get_decoder()
    handle = decoder.register_forward_pre_hook(lambda *args: grad_seen.append(torch.is_grad_enabled()))
    fast, _, _ = draft_only_forward(model, batch)
    handle.remove()
    assert grad_seen == [False, True]  # the memory stream runs without autograd
    fast.backward()
    fast_grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}
    model.zero_grad()
    joint, _, _ = dual_stream_forward(model, batch)
    joint.backward()
    torch.testing.assert_close(fast, joint, rtol=1e-5, atol=1e-5)
    assert fast_grads and all(p.grad is not None for n, p in model.named_parameters() if p.requires_grad)
    for name, parameter in model.named_parameters():
        if parameter.requires_grad:
            torch.testing.assert_close(fast_grads[name], parameter.grad, rtol=1e-4, atol=1e-5)
