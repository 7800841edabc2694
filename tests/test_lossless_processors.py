"""Lossless mode applies every logits processor as transformers' greedy `generate()` does: each verified position
with its exact prefix and length. Output equals `generate()` token for token, batched with left padding."""

import pytest
import torch
from tiny_models import EOS_ID, MASK_ID, random_prompts, tiny_model
from transformers import LogitsProcessor, LogitsProcessorList, SynthIDTextWatermarkingConfig, WatermarkingConfig
from transformers.generation import logits_process as lp

import wedlm_hf

LENGTHS = [5, 11, 2]
NEW = 24


class PrefixHashBan(LogitsProcessor):
    """A caller's processor that reads the whole prefix and its length: bans one token chosen from both."""

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        banned = (input_ids.sum(-1) * 7 + input_ids.shape[-1]) % (MASK_ID - 3) + 3
        return scores.scatter(1, banned[:, None], float("-inf"))


def _allowed(batch_id: int, ids: torch.Tensor) -> list[int]:
    """Per input row and last token: half the vocabulary (a wrong batch id or prefix shows in the output)."""
    start = 3 + (batch_id + int(ids[-1])) % 2
    return list(range(start, MASK_ID, 2))


def _options(greedy: torch.Tensor, width: int) -> dict[str, dict]:
    """The processor settings tested; bans and biases aim at bigrams greedy decoding would produce."""
    generated = greedy[:, width:]
    first, second = generated[0, 3].item(), generated[0, 4].item()
    row1 = generated[1, 6:8].tolist()
    return {
        "repetition_penalty": dict(repetition_penalty=1.5),
        "no_repeat_ngram_size": dict(no_repeat_ngram_size=2),
        "bad_words_multi_token": dict(bad_words_ids=[[first, second], row1, [generated[2, 1].item()]]),
        "sequence_bias_multi_token": dict(sequence_bias={(first, second): -30.0, tuple(row1): -30.0, (7,): 2.0}),
        "min_new_tokens": dict(min_new_tokens=9, sequence_bias={(EOS_ID,): 40.0}),
        "forced_eos": dict(forced_eos_token_id=EOS_ID, forced_bos_token_id=1),
        "begin_suppress_tokens": dict(begin_suppress_tokens=generated[:, 0].tolist()),
        "exponential_decay_length_penalty": dict(exponential_decay_length_penalty=(4, 1.6)),
        "prefix_allowed_tokens_fn": dict(prefix_allowed_tokens_fn=_allowed),
        "user_processor": dict(logits_processor=LogitsProcessorList([PrefixHashBan()])),
        "watermarking": dict(watermarking_config=WatermarkingConfig(bias=6.0, seeding_scheme="lefthash")),
        "several": dict(repetition_penalty=1.3, no_repeat_ngram_size=3, min_new_tokens=5),
    }


CASES = list(_options(torch.zeros(3, 40, dtype=torch.long), 0))


@pytest.mark.parametrize("family", ["wedlm", "llama", "qwen3"])
@pytest.mark.parametrize("case", CASES)
def test_lossless_with_processors_equals_greedy_generate(family, case):
    model = wedlm_hf.enable(tiny_model(family, seed=5, peak=40))
    input_ids, attention_mask = random_prompts(LENGTHS, seed=2)
    common = dict(input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=NEW, do_sample=False)
    plain_greedy = model.generate(**common)
    options = _options(plain_greedy, input_ids.shape[1])[case]
    greedy = model.generate(**common, **options)
    assert not torch.equal(greedy, plain_greedy) or case == "forced_eos", f"{case} changes nothing here"
    for schedule in ("adaptive", "full"):
        output = model.generate(
            **common, **options, decoding="wedlm", wedlm_lossless=True, mask_token_id=MASK_ID,
            wedlm_draft_schedule=schedule, return_dict_in_generate=True, output_scores=True,
        )
        assert torch.equal(output.sequences, greedy), (case, schedule)
    reference = model.generate(**common, **options, return_dict_in_generate=True, output_scores=True)
    is_eos = (greedy[:, input_ids.shape[1] :] == EOS_ID).int()
    ended = is_eos.cumsum(1) - is_eos
    for step, (ours, theirs) in enumerate(zip(output.scores, reference.scores)):  # each token's processed scores
        running = ended[:, step] == 0  # rows past their EOS: transformers scores padding, WeDLM nothing
        ours, theirs = ours[running], theirs[running]
        live = torch.isfinite(theirs)
        assert torch.equal(live, torch.isfinite(ours)), case
        assert torch.allclose(ours[live], theirs[live], atol=1e-4), (case, (ours[live] - theirs[live]).abs().max())


def test_drafts_are_verified_under_processors():
    """A model whose drafts are right (all logits 0: every position predicts token 0 unless a processor says
    otherwise) accepts drafts while `no_repeat_ngram_size` and a length rule reshape the output."""
    model = wedlm_hf.enable(tiny_model("wedlm", peak=40))
    with torch.no_grad():
        model.lm_head.weight.zero_()
        model.lm_head.weight[3] = 0.01  # ties broken towards 3, then 4, ... as the n-gram ban removes them
        model.lm_head.weight[4] = 0.005
    input_ids, attention_mask = random_prompts([4, 8])
    options = dict(max_new_tokens=32, do_sample=False, repetition_penalty=1.2, min_new_tokens=12)
    greedy = model.generate(input_ids=input_ids, attention_mask=attention_mask, **options)
    output = model.generate(
        input_ids=input_ids, attention_mask=attention_mask, **options, decoding="wedlm", wedlm_lossless=True,
        wedlm_draft_schedule="full", return_dict_in_generate=True,  # (drafts in every forward)
    )
    assert torch.equal(output.sequences, greedy)
    assert output.wedlm_stats.summary()["accepted"] > 0


@pytest.mark.parametrize(
    "options, name",
    [
        (dict(guidance_scale=1.5), "ClassifierFreeGuidance"),
        (dict(watermarking_config=SynthIDTextWatermarkingConfig(keys=[1, 2], ngram_len=2), do_sample=True), "SynthID"),
    ],
)
def test_lossless_refuses_what_it_cannot_honour(options, name):
    model = wedlm_hf.enable(tiny_model("wedlm", peak=40))
    input_ids, attention_mask = random_prompts([4])
    with pytest.raises(ValueError, match=f"{name}.*(model calls|per-row state)"):
        model.generate(
            input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=4, decoding="wedlm",
            wedlm_lossless=True, **options,
        )


def test_plain_mode_keeps_refusing_prefix_rules():
    """The plain mode scores every slot with the committed context only; its error points at lossless mode."""
    model = wedlm_hf.enable(tiny_model("wedlm", peak=40))
    input_ids, attention_mask = random_prompts([4])
    with pytest.raises(ValueError, match="NoRepeatNGram.*wedlm_lossless=True"):
        model.generate(
            input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=4, decoding="wedlm",
            no_repeat_ngram_size=2,
        )
    assert lp.ClassifierFreeGuidanceLogitsProcessor  # the refused classes exist in this transformers
