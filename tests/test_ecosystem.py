"""WeDLM decoding through transformers' own entry points: pipelines, streamers, stopping criteria, logits
processors, output dicts, device maps, dtypes and attention kernels."""

import threading

import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    LogitsProcessor,
    LogitsProcessorList,
    PreTrainedTokenizerFast,
    StoppingCriteria,
    StoppingCriteriaList,
    TextIteratorStreamer,
    TextStreamer,
    pipeline,
)
from transformers.generation import logits_process as lp
from transformers.generation.streamers import BaseStreamer
from patience import PATIENCE_S

from tiny_models import EOS_ID, MASK_ID, PAD_ID, VOCAB, tiny_model
import wedlm_hf
from wedlm_hf.generation.processors import check_processors
from wedlm_hf.generation.reference import reference_decode

PROMPT = "w7 w8 w9"
GREEDY = dict(decoding="wedlm", do_sample=False, max_new_tokens=24)


def build_tokenizer() -> PreTrainedTokenizerFast:
    """A whitespace word-level tokenizer over the tiny models' 96 ids, with a minimal chat template.

    "abcdef" is a word because `StopStringCriteria` probes the vocabulary by tokenizing that string.
    """
    specials = ["<pad>", "<s>", "</s>", "<unk>", "user", "assistant", "abcdef"]
    words = specials + [f"w{i}" for i in range(len(specials), MASK_ID)] + ["[MASK]"]
    assert len(words) == VOCAB and words[PAD_ID] == "<pad>" and words[EOS_ID] == "</s>"
    backend = Tokenizer(models.WordLevel({word: i for i, word in enumerate(words)}, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token="<pad>", bos_token="<s>", eos_token="</s>", unk_token="<unk>",
        mask_token="[MASK]",
    )
    tokenizer.chat_template = (
        "{% for m in messages %}{{ m['role'] }} {{ m['content'] }} {% endfor %}"
        "{% if add_generation_prompt %}assistant {% endif %}"
    )
    return tokenizer


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


@pytest.fixture(scope="module")
def model():
    return tiny_model("wedlm", peak=40)


def wedlm_tokens(model, input_ids, **kwargs) -> list[int]:
    options = {**GREEDY, **kwargs}
    return model.generate(input_ids, **options)[0, input_ids.shape[1] :].tolist()


def ids(tokenizer, text=PROMPT) -> torch.Tensor:
    return tokenizer(text, return_tensors="pt").input_ids


# --- 1. pipelines ---------------------------------------------------------------------------------------------


def test_pipeline_decoding_at_construction_and_per_call(model, tokenizer):
    expected = wedlm_tokens(model, ids(tokenizer))
    assert expected != model.generate(ids(tokenizer), do_sample=False, max_new_tokens=24)[0, 3:].tolist()
    built = pipeline("text-generation", model=model, tokenizer=tokenizer, decoding="wedlm")
    plain = pipeline("text-generation", model=model, tokenizer=tokenizer)
    options = dict(do_sample=False, max_new_tokens=24, return_tensors=True)
    for out in (built(PROMPT, **options), plain(PROMPT, decoding="wedlm", **options)):
        assert out[0]["generated_token_ids"][3:] == expected


def test_pipeline_batched_matches_single_calls(model, tokenizer):
    prompts = [PROMPT, "w40 w41 w42 w43 w44 w45", "w10"]
    pipe = pipeline("text-generation", model=model, tokenizer=tokenizer, decoding="wedlm")
    outs = pipe(prompts, batch_size=3, do_sample=False, max_new_tokens=16, return_full_text=False)
    for prompt, out in zip(prompts, outs):
        expected = wedlm_tokens(model, ids(tokenizer, prompt), max_new_tokens=16)
        assert out[0]["generated_text"] == tokenizer.decode(expected, skip_special_tokens=True)


def test_pipeline_chat_messages(model, tokenizer):
    messages = [{"role": "user", "content": "w7 w8"}]
    prompt_ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    expected = wedlm_tokens(model, prompt_ids["input_ids"], max_new_tokens=12)
    pipe = pipeline("text-generation", model=model, tokenizer=tokenizer, decoding="wedlm")
    out = pipe(messages, do_sample=False, max_new_tokens=12)[0]["generated_text"]
    assert out[:-1] == messages
    assert out[-1] == {"role": "assistant", "content": tokenizer.decode(expected, skip_special_tokens=True)}


def test_embedded_tokenizer_pads_left_and_has_a_chat_template():
    tokenizer = AutoTokenizer.from_pretrained(wedlm_hf.DEFAULT_MODEL)
    assert tokenizer.padding_side == "left"
    messages = [{"role": "system", "content": "# counting"}, {"role": "user", "content": "1, 2,"}]
    assert tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) == "# counting\n1, 2,"


def test_trained_tokenizers_pad_left_with_the_embedded_chat_template():
    """`wedlm-hf train` writes the same tokenizer settings as the embedded checkpoint carries."""
    from wedlm_hf.training.tokenizer import train_tokenizer

    trained = train_tokenizer(["def f(x):\n    return x\n"] * 20, vocab_size=300)
    embedded = AutoTokenizer.from_pretrained(wedlm_hf.DEFAULT_MODEL)
    assert trained.padding_side == embedded.padding_side == "left"
    assert trained.chat_template == embedded.chat_template


def test_embedded_checkpoint_pipeline_chat_and_batches_need_no_setup():
    """No padding side, template or decoding to set: the checkpoint's files carry them (WeDLM by default)."""
    pipe = pipeline("text-generation", model=wedlm_hf.DEFAULT_MODEL)
    prompts = ["1, 2, 3, 4,", "def add(a, b):\n    return", "import"]
    expected = []
    for prompt in prompts:
        inputs = pipe.tokenizer(prompt, return_tensors="pt")
        out = pipe.model.generate(**inputs, max_new_tokens=10, return_dict_in_generate=True)
        assert out.wedlm_stats is not None
        expected.append(pipe.tokenizer.decode(out.sequences[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True))
    batched = pipe(prompts, batch_size=3, max_new_tokens=10, return_full_text=False)
    assert [out[0]["generated_text"] for out in batched] == expected
    chat = pipe([{"role": "user", "content": prompts[0]}], max_new_tokens=10)[0]["generated_text"]
    assert chat[-1] == {"role": "assistant", "content": expected[0]}


# --- 2. streamers -----------------------------------------------------------------------------------------------


class RecordingStreamer(BaseStreamer):
    def __init__(self):
        self.puts, self.ended = [], False

    def put(self, value):
        self.puts.append(value.clone())

    def end(self):
        self.ended = True


def test_streamer_gets_one_put_per_token(model, tokenizer):
    """As in AR decoding, every committed token is its own `put` (shape (1,)), so consumers that count puts
    (e.g. `transformers serve`'s usage accounting) count tokens, even when one step commits several."""
    streamer = RecordingStreamer()
    prompt = ids(tokenizer)
    out = model.generate(prompt, streamer=streamer, return_dict_in_generate=True, **GREEDY)
    generated = out.sequences[0, 3:]
    assert torch.equal(streamer.puts[0], prompt) and streamer.ended
    tokens = streamer.puts[1:]
    assert all(t.shape == (1,) for t in tokens)
    assert torch.equal(torch.cat(tokens), generated)
    commit_steps = out.wedlm_stats.commit_steps[0]
    assert max(commit_steps.count(s) for s in set(commit_steps)) > 1, "the tiny model should commit several at once"
    ar_streamer = RecordingStreamer()
    model.generate(prompt, streamer=ar_streamer, decoding="ar", max_new_tokens=len(generated), eos_token_id=[])
    assert [t.shape for t in ar_streamer.puts[1:]] == [t.shape for t in tokens]


def test_text_streamers(model, tokenizer, capsys):
    expected = tokenizer.decode(wedlm_tokens(model, ids(tokenizer)), skip_special_tokens=True)
    model.generate(ids(tokenizer), streamer=TextStreamer(tokenizer, skip_prompt=True), **GREEDY)
    assert capsys.readouterr().out.strip() == expected.strip()

    streamer = TextIteratorStreamer(tokenizer, skip_prompt=True, timeout=PATIENCE_S)
    worker = threading.Thread(target=model.generate, kwargs=dict(inputs=ids(tokenizer), streamer=streamer, **GREEDY))
    worker.start()
    pieces = list(streamer)
    worker.join()
    assert "".join(pieces).strip() == expected.strip()


# --- 3. stopping --------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def mid_commit_stop(model, tokenizer):
    """(prompt ids, un-stopped output, stop token, its index): the stop token's first occurrence sits strictly
    inside a multi-token commit, so a correct cut keeps part of that commit and drops the rest."""
    for text in (PROMPT, "w20 w21", "w50 w60 w70", "w33", "w80 w81 w82 w83"):
        prompt = ids(tokenizer, text)
        out = model.generate(prompt, eos_token_id=[], return_dict_in_generate=True, **GREEDY)
        tokens, steps = out.sequences[0, prompt.shape[1] :].tolist(), out.wedlm_stats.commit_steps[0]
        for t in range(1, len(tokens) - 1):
            if tokens[t] not in tokens[:t] and steps[t - 1] == steps[t] == steps[t + 1]:
                return prompt, tokens, tokens[t], t
    pytest.fail("no prompt gave a stop token inside a multi-token commit")


def test_every_eos_id_stops_at_exact_token(model, mid_commit_stop):
    prompt, tokens, stop, t = mid_commit_stop
    unused = next(i for i in range(3, MASK_ID) if i not in tokens)
    assert wedlm_tokens(model, prompt, eos_token_id=[unused, stop]) == tokens[: t + 1]
    assert wedlm_tokens(model, prompt, eos_token_id=[stop, unused]) == tokens[: t + 1]


def test_stop_strings_cut_at_exact_token(model, tokenizer, mid_commit_stop):
    prompt, tokens, stop, t = mid_commit_stop
    stop_string = tokenizer.convert_ids_to_tokens(stop)
    assert wedlm_tokens(model, prompt, eos_token_id=[], stop_strings=[stop_string], tokenizer=tokenizer) == tokens[: t + 1]
    pipe = pipeline("text-generation", model=model, tokenizer=tokenizer, decoding="wedlm")
    text = pipe(tokenizer.decode(prompt[0]), stop_sequence=stop_string, eos_token_id=[], do_sample=False,
                max_new_tokens=24, return_full_text=False)[0]["generated_text"]
    assert text == tokenizer.decode(tokens[: t + 1])


class StopOn(StoppingCriteria):
    def __init__(self, token: int):
        self.token = token

    def __call__(self, input_ids, scores, **kwargs):
        return input_ids[:, -1] == self.token


def test_user_stopping_criteria_and_max_time(model, mid_commit_stop):
    prompt, tokens, stop, t = mid_commit_stop
    criteria = StoppingCriteriaList([StopOn(stop)])
    assert wedlm_tokens(model, prompt, eos_token_id=[], stopping_criteria=criteria) == tokens[: t + 1]
    assert wedlm_tokens(model, prompt, eos_token_id=[], max_time=0.0) == tokens[:1]


# --- 4. logits processors -------------------------------------------------------------------------------------


@pytest.mark.parametrize("warper", [dict(top_k=1), dict(top_p=1e-6), dict(min_p=1.0), dict(top_k=1, temperature=0.3)])
def test_warpers_apply_per_slot(model, tokenizer, warper):
    """Sampling from a warper that keeps only the best token must reproduce greedy decoding."""
    torch.manual_seed(0)
    assert wedlm_tokens(model, ids(tokenizer), do_sample=True, **warper) == wedlm_tokens(model, ids(tokenizer))


class ContextRecorder(LogitsProcessor):
    def __init__(self):
        self.contexts = []

    def __call__(self, input_ids, scores):
        self.contexts.append(input_ids.clone())
        return scores


def test_processors_see_committed_tokens_as_context(model, tokenizer):
    recorder = ContextRecorder()
    prompt = ids(tokenizer)
    out = model.generate(prompt, logits_processor=LogitsProcessorList([recorder]), **GREEDY)[0]
    assert out.tolist()[3:] == wedlm_tokens(model, prompt)
    lengths = [c.shape[1] for c in recorder.contexts]
    assert lengths == sorted(lengths) and lengths[0] == 3 and len(set(lengths)) > 1
    for context in recorder.contexts:
        assert all(torch.equal(row, out[: context.shape[1]]) for row in context)


def test_committed_context_processors(model, tokenizer):
    baseline = wedlm_tokens(model, ids(tokenizer))
    common = max(set(baseline), key=baseline.count)
    assert common not in wedlm_tokens(model, ids(tokenizer), bad_words_ids=[[common]])
    penalised = wedlm_tokens(model, ids(tokenizer), repetition_penalty=1e4)
    assert len(set(penalised)) > len(set(baseline))


REJECTED = [
    lp.MinLengthLogitsProcessor(5, EOS_ID),
    lp.MinNewTokensLengthLogitsProcessor(3, 5, EOS_ID),
    lp.NoRepeatNGramLogitsProcessor(2),
    lp.NoBadWordsLogitsProcessor([[5, 6]], EOS_ID),
    lp.SequenceBiasLogitsProcessor({(5, 6): 2.0}),
    lp.PrefixConstrainedLogitsProcessor(lambda batch, ids: [5], 1),
    lp.ForcedEOSTokenLogitsProcessor(10, EOS_ID),
    lp.ExponentialDecayLengthPenalty((5, 1.5), EOS_ID, 3),
]


@pytest.mark.parametrize("processor", REJECTED, ids=lambda p: type(p).__name__)
def test_check_processors_rejects_unhonoured(processor):
    with pytest.raises(ValueError, match=type(processor).__name__):
        check_processors(LogitsProcessorList([lp.TemperatureLogitsWarper(0.7), processor]))


def test_check_processors_accepts_honoured():
    check_processors(
        LogitsProcessorList([
            lp.TemperatureLogitsWarper(0.7), lp.TopKLogitsWarper(5), lp.TopPLogitsWarper(0.9), lp.MinPLogitsWarper(0.1),
            lp.RepetitionPenaltyLogitsProcessor(1.3), lp.NoBadWordsLogitsProcessor([[5], [7]], EOS_ID),
            lp.SequenceBiasLogitsProcessor({(5,): -1.0}), ContextRecorder(),
        ])
    )
    check_processors(None)


def test_generate_rejects_unhonoured_processor(model, tokenizer):
    with pytest.raises(ValueError, match="NoRepeatNGramLogitsProcessor"):
        model.generate(ids(tokenizer), no_repeat_ngram_size=2, **GREEDY)


# --- 5. outputs -------------------------------------------------------------------------------------------------


def test_scores_and_logits_follow_generated_order(model, tokenizer):
    batch = tokenizer([PROMPT, "w40 w41 w42 w43 w44"], return_tensors="pt", padding=True)
    out = model.generate(**batch, return_dict_in_generate=True, output_scores=True, output_logits=True, **GREEDY)
    prompt_length = batch["input_ids"].shape[1]
    generated = out.sequences[:, prompt_length:]
    assert len(out.scores) == len(out.logits) == generated.shape[1]
    for row, count in enumerate(out.wedlm_stats.generated):
        for t in range(count):
            assert out.scores[t].shape == (2, VOCAB)
            assert int(out.scores[t][row].argmax()) == int(generated[row, t])
            expected = out.logits[t][row].clone()
            expected[MASK_ID] = float("-inf")
            assert torch.equal(out.scores[t][row], expected)


def test_outputs_serve_training_and_in_place_edits_as_generates_do(model, tokenizer):
    """The decode runs in inference mode; what it returns is ordinary tensors, as `generate()`'s: generated text
    trains the model (its ids saved for the backward pass) and outputs change in place."""
    out = model.generate(ids(tokenizer), return_dict_in_generate=True, output_scores=True, **GREEDY)
    assert not out.sequences.is_inference() and not out.scores[0].is_inference()
    model.train()
    try:
        model(out.sequences, labels=out.sequences).loss.backward()
    finally:
        model.zero_grad(set_to_none=True)
        model.eval()
    out.sequences[:, 0] = PAD_ID
    out.scores[0].zero_()


def test_num_return_sequences_with_sampling(model, tokenizer):
    torch.manual_seed(0)
    batch = tokenizer([PROMPT, "w40 w41"], return_tensors="pt", padding=True)
    out = model.generate(**batch, num_return_sequences=3, do_sample=True, temperature=3.0, decoding="wedlm",
                         max_new_tokens=16, return_dict_in_generate=True)
    width = batch["input_ids"].shape[1]
    assert out.sequences.shape[0] == 6 and len(out.wedlm_stats.generated) == 6
    assert torch.equal(out.sequences[:, :width], batch["input_ids"].repeat_interleave(3, dim=0))
    assert len({tuple(row.tolist()) for row in out.sequences[:3]}) > 1


def test_wedlm_stats(model, tokenizer):
    out = model.generate(ids(tokenizer), return_dict_in_generate=True, **GREEDY)
    stats = out.wedlm_stats
    assert stats.generated == [out.sequences.shape[1] - 3]
    assert stats.forwards == [stats.model_calls] and stats.tokens_per_forward == [stats.generated[0] / stats.forwards[0]]
    assert stats.processed[0] >= stats.generated[0] and stats.p_cache == [stats.generated[0] / stats.processed[0]]
    assert len(stats.commit_steps[0]) == stats.generated[0]


# --- 6. devices, dtypes, kernels --------------------------------------------------------------------------------


def test_device_map_auto_and_disk_offload(model, tokenizer, tmp_path):
    """accelerate's dispatch (here with one layer offloaded to disk behind hooks) must not change the tokens."""
    model.save_pretrained(tmp_path)
    expected = wedlm_tokens(model, ids(tokenizer))
    assert wedlm_tokens(AutoModelForCausalLM.from_pretrained(tmp_path, device_map="auto"), ids(tokenizer)) == expected
    placement = {name: "cpu" for name in ("model.embed_tokens", "model.layers.0", "model.norm", "model.rotary_emb", "lm_head")}
    offloaded = AutoModelForCausalLM.from_pretrained(
        tmp_path, device_map={**placement, "model.layers.1": "disk"}, offload_folder=tmp_path / "offload"
    )
    assert offloaded.hf_device_map["model.layers.1"] == "disk"
    assert wedlm_tokens(offloaded, ids(tokenizer)) == expected


@pytest.mark.parametrize("family", ["wedlm", "wedlm-qwen2"])
def test_bfloat16_matches_cache_free_reference(family, tokenizer):
    bf16 = tiny_model(family, peak=40).to(torch.bfloat16)
    prompt = ids(tokenizer)
    assert bf16.lm_head.weight.dtype == torch.bfloat16
    out = bf16.generate(prompt, return_dict_in_generate=True, **GREEDY)
    expected, _ = reference_decode(bf16, prompt[0].tolist(), 24, MASK_ID, eos_token_ids=[EOS_ID])
    assert out.sequences[0, 3:].tolist() == expected


def test_eager_and_sdpa_agree(tokenizer):
    prompt = ids(tokenizer)
    eager = wedlm_tokens(tiny_model("wedlm", peak=40, attn="eager"), prompt)
    assert eager == wedlm_tokens(tiny_model("wedlm", peak=40, attn="sdpa"), prompt)
