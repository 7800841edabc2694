"""Draft-only adapters (`wedlm_hf.draft_adapter`): the base model stays itself at every observed token, so lossless
decoding with the adapter is the base model's greedy `generate()`; proved against the base with the adapter disabled.
The gate acts at the slots the decoder placed as masks (`generation.mask_slots`), never at a token that merely reads
as the mask, and never outside WeDLM decoding."""

import copy
import json
from contextvars import copy_context
from types import SimpleNamespace

import pytest
import torch

peft = pytest.importorskip("peft")

import wedlm_hf  # noqa: E402
from side_by_side import run_side_by_side  # noqa: E402
from tiny_models import MASK_ID, random_prompts, tiny_model  # noqa: E402
from transformers import AutoModelForCausalLM, GenerationConfig  # noqa: E402
from wedlm_hf.bench.syncs import SyncCounter  # noqa: E402
from wedlm_hf.draft_adapter import (  # noqa: E402
    MERGE_REFUSED,
    draft_only_defaults,
    draft_only_lora_config,
    draft_only_mask_id,
    gate_draft_only_adapters,
    linear_module_names,
)
from wedlm_hf.evaluation.default_decoding import lossless  # noqa: E402
from wedlm_hf.evaluation.default_decoding import write_default_decoding  # noqa: E402
from wedlm_hf.generation.mask_slots import MASK_SLOTS, MaskSlots, forward_with_mask_slots  # noqa: E402
from wedlm_hf.loading import load_model_and_tokenizer  # noqa: E402
from wedlm_hf.training import DualStreamCollator  # noqa: E402
from wedlm_hf.training.draft_objective import draft_only_forward  # noqa: E402
from wedlm_hf.training.objective import dual_stream_forward  # noqa: E402

FAMILIES = ("llama", "qwen3")
FIRST_WINDOW_CHECKED = {"wedlm_entropy_threshold": 100.0}
"""A random adapter's first-window drafts count as confident: the adaptive schedule checks them at once (its
next try would come after more tokens than a test decodes)."""


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
    slots = torch.ones(2, ids.shape[1] - observed, dtype=torch.bool)
    with torch.no_grad():
        out = forward_with_mask_slots(model, slots, input_ids=ids, attention_mask=attention, use_cache=True)
        plain = model(input_ids=ids, attention_mask=attention)
        with model.disable_adapter():
            base = model(input_ids=ids, attention_mask=attention, use_cache=True)
    assert torch.equal(plain.logits, base.logits)  # outside WeDLM decoding, mask tokens or not: the base model
    assert torch.equal(out.logits[:, :observed], base.logits[:, :observed])
    for layer, base_layer in zip(out.past_key_values.layers, base.past_key_values.layers):
        assert torch.equal(layer.keys[:, :, :observed], base_layer.keys[:, :, :observed])
        assert torch.equal(layer.values[:, :, :observed], base_layer.values[:, :, :observed])
    assert (out.logits[:, observed:] - base.logits[:, observed:]).abs().max() > 0.1  # the adapter drafts
    ungated = adapted(family, gated=False)  # the same weights on every token: the check above can fail
    with torch.no_grad():
        assert not torch.equal(ungated(input_ids=ids, attention_mask=attention).logits[:, :observed], base.logits[:, :observed])


def test_the_adapter_acts_at_the_marked_slots_of_each_row_alone():
    """Rows with fewer mask slots than the marked columns: their other columns stay the base model's."""
    model = adapted("llama")
    ids, attention, observed = window_batch()
    slots = torch.tensor([[True, True, True, True], [False, False, True, True]])
    with torch.no_grad():
        out = forward_with_mask_slots(model, slots, input_ids=ids, attention_mask=attention).logits
        with model.disable_adapter():
            base = model(input_ids=ids, attention_mask=attention).logits
    changed = (out - base).abs().amax(-1) > 0
    assert torch.equal(changed[:, observed:], slots) and not changed[:, :observed].any()


def test_a_forward_without_mask_slots_skips_the_adapter(monkeypatch):
    from wedlm_hf.draft_adapter import gate

    model = adapted("llama")
    calls, linear = [], torch.nn.functional.linear
    deltas = {id(weight) for name, weight in model.named_parameters() if ".lora_" in name}

    def counted(x, weight, *args):
        calls.extend([1] * (id(weight) in deltas))
        return linear(x, weight, *args)

    monkeypatch.setattr(gate, "F", SimpleNamespace(linear=counted))
    ids, attention = random_prompts([6, 4], seed=5)
    ids[0, -1] = MASK_ID  # reads as the mask, is no mask slot
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=attention).logits
        with model.disable_adapter():
            base = model(input_ids=ids, attention_mask=attention).logits
        forward_with_mask_slots(model, torch.ones(2, 0, dtype=torch.bool), input_ids=ids, attention_mask=attention)
        assert calls == []
        forward_with_mask_slots(model, torch.ones(1, 2, dtype=torch.bool), input_ids=torch.full((1, 5), MASK_ID))
    assert torch.equal(out, base) and len(calls) == 2 * 7 * 2  # A and B of 7 projections in each of 2 layers
    assert MASK_SLOTS.get() is None  # reset when the forward returned


def test_a_base_layer_with_a_hook_is_called_as_a_module_where_the_adapter_is_skipped():
    """The gate applies a plain linear base layer directly, but not one with hooks: they still run."""
    model = adapted("llama")
    layer = next(module for name, module in model.named_modules() if name.endswith("q_proj.base_layer"))
    hooked = []
    layer.register_forward_hook(lambda *args: hooked.append(1))
    ids, attention = random_prompts([6, 4], seed=5)
    with torch.no_grad():
        model(input_ids=ids, attention_mask=attention)
    assert hooked == [1]


def test_without_mask_slots_a_gated_layer_is_its_base_layer_unless_another_adapter_shares_it(monkeypatch):
    """Where no slot is a mask, a gated layer skips PEFT's forward (its bookkeeping is a per-layer cost); a layer
    that also carries an ordinary LoRA adapter runs PEFT's forward, so that adapter still adds its delta; a deep
    copy of the model skips on its own layers."""
    from peft.tuners.lora.layer import Linear as LoraLinear

    model = adapted("llama")
    peft_forwards = []
    peft_forward = LoraLinear.forward
    counted = lambda *args, **kwargs: peft_forwards.append(1) or peft_forward(*args, **kwargs)  # noqa: E731
    monkeypatch.setattr(LoraLinear, "forward", counted)
    ids, attention = random_prompts([6, 4], seed=5)
    with torch.no_grad():
        for each in (model, copy.deepcopy(model)):
            out = each(input_ids=ids, attention_mask=attention).logits
            assert peft_forwards == []
            with each.disable_adapter():
                assert torch.equal(out, each(input_ids=ids, attention_mask=attention).logits)
        forward_with_mask_slots(model, torch.ones(1, 2, dtype=torch.bool), input_ids=torch.full((1, 5), MASK_ID))
        assert len(peft_forwards) == 2 * 7  # 7 projections in each of 2 layers
        model.add_adapter("plain", peft.LoraConfig(r=2, target_modules=["q_proj"], init_lora_weights=False))
        model.base_model.set_adapter(["default", "plain"])
        peft_forwards.clear()
        shifted = model(input_ids=ids, attention_mask=attention).logits
    assert len(peft_forwards) == 2 and not torch.equal(shifted, out)  # the two q_proj layers


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("schedule", ["adaptive", "full"])
def test_lossless_with_the_adapter_is_the_base_models_greedy_generate(family, schedule):
    model = adapted(family)
    wedlm_hf.enable(model)  # a PeftModel: the gate stays on, the transformers model inside is enabled
    ids, attention = random_prompts([9, 4, 6], seed=7)
    with torch.no_grad():
        out = model.generate(
            input_ids=ids, attention_mask=attention, decoding="wedlm", wedlm_lossless=True,
            wedlm_draft_schedule=schedule, max_new_tokens=24, return_dict_in_generate=True, **FIRST_WINDOW_CHECKED,
        )
        with model.disable_adapter():
            greedy = model.generate(input_ids=ids, attention_mask=attention, max_new_tokens=24, do_sample=False)
        alone = model.generate(
            input_ids=ids[1:2, -4:], attention_mask=attention[1:2, -4:], decoding="wedlm", wedlm_lossless=True,
            wedlm_draft_schedule=schedule, max_new_tokens=24, **FIRST_WINDOW_CHECKED,
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
    length = batch["input_ids"].shape[1] // 2
    masked = torch.cat([torch.zeros(3, length, dtype=torch.bool), batch["input_ids"][:, length:] == MASK_ID], 1)
    joint, _, _ = copy_context().run(with_mask_slots, masked, dual_stream_forward, model, batch)
    joint.backward()
    torch.testing.assert_close(fast, joint, rtol=1e-5, atol=1e-5)
    assert fast_grads and all(p.grad is not None for n, p in model.named_parameters() if p.requires_grad)
    for name, parameter in model.named_parameters():
        if parameter.requires_grad:
            torch.testing.assert_close(fast_grads[name], parameter.grad, rtol=1e-4, atol=1e-5)


def with_mask_slots(mask: torch.Tensor, call, *args):
    """`call(*args)` with the mask slots `mask` marks over the whole feed, as a suffix as wide as the feed (training
    names them by position: the two forms checked against each other); run it in a copied context."""
    MASK_SLOTS.set(MaskSlots(*mask.shape, suffix=mask[..., None]))
    return call(*args)


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
        logits = forward_with_mask_slots(model, torch.ones(2, 3, dtype=torch.bool), input_ids=probe).logits
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


@pytest.mark.parametrize("family", FAMILIES)
def test_a_prompt_holding_the_mask_token_is_decoded_as_the_base_model_decodes_it(family):
    """A user may type the mask token (SmolLM2's is `<empty_output>`): it is an observed token like any other."""
    model = wedlm_hf.enable(adapted(family))
    ids, attention = random_prompts([9, 6], seed=11)
    ids[0, 3] = ids[1, -2] = MASK_ID
    with torch.no_grad():
        out = model.generate(
            input_ids=ids, attention_mask=attention, decoding="wedlm", wedlm_lossless=True, max_new_tokens=16,
            return_dict_in_generate=True, **FIRST_WINDOW_CHECKED,
        )
        with model.disable_adapter():
            greedy = model.generate(input_ids=ids, attention_mask=attention, max_new_tokens=16, do_sample=False)
    assert torch.equal(out.sequences, greedy)
    assert out.wedlm_stats.summary()["drafted"] > 0


def test_wedlm_and_ar_from_two_threads_on_one_gated_model_equal_their_lone_runs():
    """The demo's set-up: WeDLM on one side, AR on the other, one model; neither sees the other's mask slots."""
    model = wedlm_hf.enable(adapted("qwen3"))
    ids, attention = random_prompts([6, 4], seed=3)
    runs = {"wedlm": dict(decoding="wedlm", wedlm_lossless=True, wedlm_window_size=8), "ar": dict(decoding="ar")}

    def generate(options: dict) -> torch.Tensor:
        with torch.no_grad():
            return model.generate(input_ids=ids, attention_mask=attention, max_new_tokens=16, **options)

    lone = {name: generate(options) for name, options in runs.items()}
    with torch.no_grad(), model.disable_adapter():
        assert torch.equal(lone["ar"], model.generate(input_ids=ids, attention_mask=attention, max_new_tokens=16))
    outputs = run_side_by_side(runs, generate, 4)
    for name in runs:
        assert len(outputs[name]) == 4 and all(torch.equal(out, lone[name]) for out in outputs[name]), name


def test_the_gate_reads_nothing_on_the_host(monkeypatch):
    """No `nonzero` or other host read per forward: decoding with the adapter keeps the loop's syncs per step."""
    from test_syncs import SYNCS_PER_STEP

    model = wedlm_hf.enable(adapted("llama"))
    ids, attention = random_prompts([7, 5], seed=4)
    counter = SyncCounter()
    with counter.patched(monkeypatch), torch.no_grad():
        out = model.generate(
            input_ids=ids, attention_mask=attention, decoding="wedlm", wedlm_lossless=True, max_new_tokens=24,
            return_dict_in_generate=True,
        )
    steps = out.wedlm_stats.model_calls
    assert steps > 3 and counter.count / steps <= SYNCS_PER_STEP, sorted(set(counter.where))
    assert not {"nonzero", "torch.nonzero"} & set(counter.where)


def saved_adapter(folder) -> tuple:
    """A tiny base folder (model and tokenizer) and a draft-only adapter folder over it whose generation config
    makes lossless WeDLM with every slot drafted its default, written as `wedlm-hf finetune` writes it."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    base_folder, adapter_folder = folder / "base", folder / "adapter"
    words = Tokenizer(models.WordLevel({f"<{i}>": i for i in range(MASK_ID + 1)}, unk_token="<3>"))
    words.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=words, pad_token="<0>", eos_token="<2>").save_pretrained(base_folder)
    tiny_model("llama").save_pretrained(base_folder)  # the base `adapted` wraps
    model = adapted("llama", gated=False)
    model.peft_config["default"].base_model_name_or_path = str(base_folder)
    model.save_pretrained(adapter_folder)
    GenerationConfig(
        eos_token_id=2, pad_token_id=0, do_sample=False, decoding="wedlm", mask_token_id=MASK_ID,
        suppress_tokens=[MASK_ID], wedlm_draft_schedule="full",
    ).save_pretrained(adapter_folder)
    write_default_decoding(adapter_folder, lossless("chosen by the test"))
    return base_folder, adapter_folder


def test_a_draft_only_adapter_decodes_as_its_folder_says_however_it_is_loaded(tmp_path):
    """`generate()` without `decoding=` runs the folder's default (lossless WeDLM, every slot drafted): the same
    forwards as asking for it, not AR's, whether loaded by wedlm_hf, by PEFT or by transformers."""
    base_folder, folder = saved_adapter(tmp_path)
    assert draft_only_defaults(json.loads((folder / "adapter_config.json").read_text()))["wedlm_lossless"] is True
    ids, attention = random_prompts([7, 5], seed=9)
    ways = {
        "wedlm_hf.loading": lambda: load_model_and_tokenizer(str(folder))[0],
        "PeftModel": lambda: peft.PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base_folder), folder),
        "transformers": lambda: AutoModelForCausalLM.from_pretrained(folder),
    }
    defaults = {}
    for way, load in ways.items():
        model = wedlm_hf.enable(load())
        widths = []
        inner = model.get_base_model() if hasattr(model, "get_base_model") else model
        hook = inner.register_forward_pre_hook(
            lambda module, args, kwargs: widths.append(kwargs["input_ids"].shape[1]), with_kwargs=True
        )

        def forwards(**options) -> tuple[torch.Tensor, list[int]]:
            widths.clear()
            with torch.no_grad():
                out = model.generate(input_ids=ids, attention_mask=attention, max_new_tokens=12, **options)
            return out, list(widths)

        default, explicit, ar = forwards(), forwards(decoding="wedlm", wedlm_lossless=True), forwards(decoding="ar")
        hook.remove()
        assert default[1] == explicit[1] != ar[1], way
        assert torch.equal(default[0], explicit[0]) and torch.equal(default[0], ar[0]), way
        defaults[way] = default[1]
    assert len({tuple(widths) for widths in defaults.values()}) == 1  # every slot drafted in each: the folder's schedule
