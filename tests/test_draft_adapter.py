"""Draft-only adapters (`wedlm_hf.draft_adapter`): the base model stays itself at every observed token, so lossless
decoding with the adapter is the base model's greedy `generate()`; proved against the base with the adapter disabled."""

import json
from types import SimpleNamespace

import pytest
import torch

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


def test_a_forward_without_mask_slots_skips_the_adapter(monkeypatch):
    from wedlm_hf.draft_adapter import gate

    model = adapted("llama")
    calls = []
    linear = torch.nn.functional.linear
    monkeypatch.setattr(gate, "F", SimpleNamespace(linear=lambda *args: calls.append(1) or linear(*args)))
    ids, attention = random_prompts([6, 4], seed=5)
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=attention).logits
        with model.disable_adapter():
            base = model(input_ids=ids, attention_mask=attention).logits
        assert calls == []
        model(input_ids=torch.full((1, 2), MASK_ID))
    assert torch.equal(out, base) and len(calls) == 2 * 7 * 2  # A and B of 7 projections in each of 2 layers


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


def test_smollm2_with_a_draft_only_adapter_is_smollm2_at_every_observed_token():
    from real_model import load_smollm2

    base, tokenizer = load_smollm2()
    mask_id = tokenizer.convert_tokens_to_ids("<empty_output>")
    model = peft.get_peft_model(base, draft_only_lora_config(4, 8, ["q_proj", "o_proj", "down_proj"], mask_id))
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "lora_B" in name:
                parameter.normal_(0, 0.05, generator=torch.Generator().manual_seed(0))
    wedlm_hf.enable(model.eval())
    tokenizer.padding_side = "left"
    chats = [[{"role": "user", "content": "Name three primary colors."}], [{"role": "user", "content": "What is 12 times 12?"}]]
    texts = [tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True) for chat in chats]
    inputs = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
    probe = torch.cat([inputs["input_ids"], torch.full((2, 3), mask_id)], 1)
    observed = inputs["input_ids"].shape[1]
    with torch.inference_mode():
        logits = model(input_ids=probe).logits
        lossless = model.generate(**inputs, decoding="wedlm", wedlm_lossless=True, max_new_tokens=20)
        with model.disable_adapter():
            base_logits = model(input_ids=probe).logits
            greedy = model.generate(**inputs, max_new_tokens=20, do_sample=False)
    assert torch.equal(logits[:, :observed], base_logits[:, :observed])
    assert not torch.equal(logits[:, observed:], base_logits[:, observed:])
    assert torch.equal(lossless, greedy)


def test_batch_jobs_and_the_continuous_batcher_return_the_base_models_greedy_output():
    """Rows of different lengths and budgets finish at different steps, in `batch_generate` and joining a running
    batch; each equals the base model's own greedy continuation."""
    from transformers import PreTrainedTokenizerFast
    from tokenizers import Tokenizer, models, pre_tokenizers

    from wedlm_hf.continuous.manager import ContinuousBatcher

    model = wedlm_hf.enable(adapted("qwen3"))
    inner = model.get_base_model()
    words = Tokenizer(models.WordLevel({f"<{i}>": i for i in range(MASK_ID + 1)}, unk_token="<3>"))
    words.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=words, pad_token="<0>", eos_token="<2>")
    tokenizer.padding_side = "left"
    prompts = [[5, 6, 7, 8, 9], [10, 11, 12], [20, 21, 22, 23, 24, 25, 26, 27], [30, 31]]
    budgets = [12, 7, 20, 9]
    with torch.no_grad(), model.disable_adapter():
        greedy = [
            inner.generate(torch.tensor([p]), max_new_tokens=b, do_sample=False)[0, len(p) :].tolist()
            for p, b in zip(prompts, budgets)
        ]
    rows = [{"prompt": " ".join(f"<{i}>" for i in p), "max_new_tokens": b} for p, b in zip(prompts, budgets)]
    results = wedlm_hf.batch_generate(
        inner, tokenizer, rows, batch_size=4, decoding="wedlm", wedlm_lossless=True
    )
    assert [tokenizer(r["continuation"], add_special_tokens=False)["input_ids"] for r in results] == [
        [t for t in g if t != 2] for g in greedy
    ]
    config = inner.generation_config
    config.mask_token_id, config.wedlm_lossless = MASK_ID, True
    with ContinuousBatcher(inner, config, max_batch_size=2) as batcher:
        handles = [batcher.submit(p, b) for p, b in zip(prompts, budgets)]
        assert [handle.result().tokens for handle in handles] == greedy
