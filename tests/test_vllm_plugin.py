"""WeDLM drafting inside vLLM (`wedlm_vllm`): output token-identical to transformers' greedy `generate()`, through
`LLM.generate` (one request at a time and batched) and `vllm serve` + the `openai` client; tokens per forward as
the drafter counts them; the one-line refusals. Runs where vLLM is installed (`.ci/run` makes that environment:
vllm-cpu 0.32, its transformers 5.19); the main suite, without vLLM, skips this file. SmolLM2 runs when
`WEDLM_SMOLLM2` names its dequantized folder (`python -c "from wedlm_hf.loading import pretrained_path;
print(pretrained_path('smollm2'))"` in the project environment)."""

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed: these tests run in the vLLM environment (.ci/run)")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB per engine

import torch  # noqa: E402
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM  # noqa: E402
from transformers import Qwen3ForCausalLM  # noqa: E402
from vllm import LLM, SamplingParams  # noqa: E402

import wedlm_vllm  # noqa: E402
from wedlm_vllm.config import WeDLMVllmConfig  # noqa: E402

TINY = Path(__file__).resolve().parents[1] / "wedlm_hf" / "checkpoints" / "wedlm-tiny-code"
COUNTING = [", ".join(str(n) for n in range(start, start + 8)) + ", " for start in (1, 98, 195, 292)]
CODE = [
    "def read_lines(path):\n    with open(path) as handle:\n",
    "class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, item):\n",
    "import os\n\n\ndef walk(top):\n    for name in os.listdir(top):\n",
]
NEW_TOKENS = 64
GREEDY = SamplingParams(temperature=0, max_tokens=NEW_TOKENS)
ENGINE = dict(dtype="float32", enforce_eager=True, max_model_len=1024, seed=0)


def transformers_greedy(model, tokenizer, prompts: list[str]) -> list[list[int]]:
    """transformers' greedy `generate()`, one prompt at a time, fp32: the reference."""
    outputs = []
    for prompt in prompts:
        ids = tokenizer(prompt, return_tensors="pt")
        with torch.no_grad():
            sequence = model.generate(**ids, max_new_tokens=NEW_TOKENS, do_sample=False)[0]
        outputs.append(sequence[ids["input_ids"].shape[1] :].tolist())
    return outputs


def vllm_tokens(llm: LLM, prompts: list[str], batched: bool) -> list[list[int]]:
    if batched:
        return [list(out.outputs[0].token_ids) for out in llm.generate(prompts, GREEDY, use_tqdm=False)]
    return [list(llm.generate([prompt], GREEDY, use_tqdm=False)[0].outputs[0].token_ids) for prompt in prompts]


@pytest.fixture(scope="module")
def tiny_reference() -> list[list[int]]:
    """The embedded checkpoint's layers are transformers' Qwen3 layers: its greedy output is Qwen3's
    (tests/test_vllm_config.py checks `WeDLMForCausalLM` agrees)."""
    config = WeDLMVllmConfig.from_pretrained(TINY)
    model = Qwen3ForCausalLM.from_pretrained(TINY, config=config, dtype=torch.float32).eval()
    return transformers_greedy(model, AutoTokenizer.from_pretrained(TINY), COUNTING + CODE)


@pytest.fixture(scope="module")
def tiny_wedlm():
    llm = LLM(model=str(TINY), speculative_config=wedlm_vllm.speculative_config(), **ENGINE)
    yield llm
    del llm


@pytest.mark.parametrize("batched", [False, True], ids=["one-at-a-time", "batched"])
def test_embedded_checkpoint_equals_transformers_greedy(tiny_wedlm, tiny_reference, batched):
    assert vllm_tokens(tiny_wedlm, COUNTING + CODE, batched) == tiny_reference


def test_prompt_lookup_drafts_keep_the_output(tiny_reference):
    llm = LLM(model=str(TINY), speculative_config=wedlm_vllm.speculative_config(prompt_lookup=True), **ENGINE)
    assert vllm_tokens(llm, COUNTING[:1] + CODE, batched=False) == tiny_reference[:1] + tiny_reference[len(COUNTING) :]
    assert wedlm_vllm.stats(llm)["drafted"] > 0


def test_counting_takes_few_forwards_per_token(tiny_wedlm, tiny_reference):
    """Issue 33's target at the default slot count: at most 0.15 target forwards per generated token."""
    wedlm_vllm.stats(tiny_wedlm, reset=True)
    assert vllm_tokens(tiny_wedlm, COUNTING, batched=False) == tiny_reference[: len(COUNTING)]
    counts = wedlm_vllm.stats(tiny_wedlm)
    assert counts["tokens"] >= NEW_TOKENS * len(COUNTING)  # accepted; vLLM drops those past max_tokens
    assert counts["forwards"] <= 0.15 * NEW_TOKENS * len(COUNTING), counts
    assert counts["accepted"] <= counts["drafted"]


def test_wedlm_checkpoint_without_speculative_config_decodes_as_plain_vllm(tiny_reference):
    llm = LLM(model=str(TINY), **ENGINE)
    assert vllm_tokens(llm, COUNTING[:1] + CODE[:1], batched=True) == [tiny_reference[0], tiny_reference[len(COUNTING)]]
    assert wedlm_vllm.stats(llm) == dict.fromkeys(wedlm_vllm.stats(llm), 0)


def random_checkpoint(path: Path, family: str) -> tuple[Path, torch.nn.Module]:
    """A small random model of `family` with the embedded checkpoint's tokenizer, saved for vLLM; its transformers
    model. "wedlm-qwen2": the WeDLM-7B layout (q/k/v bias, no q/k norm) under model_type "wedlm"."""
    torch.manual_seed(0)
    sizes = dict(vocab_size=2048, hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=2,
                 num_key_value_heads=1, max_position_embeddings=1024, eos_token_id=0, pad_token_id=1,
                 initializer_range=0.2)
    if family == "llama":
        model = LlamaForCausalLM(LlamaConfig(**sizes))
    else:
        model = Qwen2ForCausalLM(Qwen2Config(**sizes, tie_word_embeddings=False))
    model.eval().save_pretrained(path)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(TINY / name, path / name)
    if family == "wedlm-qwen2":
        config = json.loads((path / "config.json").read_text())
        config.update(model_type="wedlm", architectures=["WeDLMForCausalLM"], attention_bias=True, mask_token_id=2)
        (path / "config.json").write_text(json.dumps(config))
    return path, model


@pytest.mark.parametrize("family", ["llama", "wedlm-qwen2"])
def test_random_models_of_each_layout_equal_transformers_greedy(tmp_path, family):
    """A stock Llama given a mask id (its drafts fail: the one-token path) and the WeDLM-7B layout."""
    path, model = random_checkpoint(tmp_path, family)
    reference = transformers_greedy(model, AutoTokenizer.from_pretrained(path), CODE)
    spec = wedlm_vllm.speculative_config(mask_token_id=2 if family == "llama" else None)
    llm = LLM(model=str(path), speculative_config=spec, **ENGINE)
    assert vllm_tokens(llm, CODE, batched=False) == reference
    assert vllm_tokens(llm, CODE, batched=True) == reference


SMOLLM2 = os.environ.get("WEDLM_SMOLLM2")
SMOLLM2_PROMPTS = COUNTING[:2] + CODE[:2] + ["<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"]


@pytest.mark.skipif(not SMOLLM2, reason="WEDLM_SMOLLM2 (SmolLM2's dequantized folder) is not set")
def test_smollm2_with_mask_id_16_equals_transformers_greedy():
    model = LlamaForCausalLM.from_pretrained(SMOLLM2, dtype=torch.float32).eval()
    reference = transformers_greedy(model, AutoTokenizer.from_pretrained(SMOLLM2), SMOLLM2_PROMPTS)
    llm = LLM(model=SMOLLM2, speculative_config=wedlm_vllm.speculative_config(mask_token_id=16), **ENGINE)
    assert vllm_tokens(llm, SMOLLM2_PROMPTS, batched=False) == reference
    assert vllm_tokens(llm, SMOLLM2_PROMPTS, batched=True) == reference


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_vllm_serve_answers_the_openai_client_with_the_greedy_tokens(tiny_reference, tmp_path):
    openai = pytest.importorskip("openai")
    port = free_port()
    # `vllm serve`'s server; vllm-cpu 0.32's `vllm` command fails at start (it asks for the version of a
    # distribution named "vllm"), the server module does not
    command = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(TINY), "--port", str(port),
               "--host", "127.0.0.1", "--dtype", "float32", "--enforce-eager", "--max-model-len", "1024",
               "--speculative-config", json.dumps(wedlm_vllm.speculative_config())]
    log = open(tmp_path / "serve.log", "w")
    server = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    try:
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none")
        deadline = time.monotonic() + 300
        while True:
            assert server.poll() is None, (tmp_path / "serve.log").read_text()[-3000:]
            try:
                client.models.list()
                break
            except openai.APIConnectionError:
                assert time.monotonic() < deadline, "vllm serve did not start within 300 s"
                time.sleep(1)
        tokenizer = AutoTokenizer.from_pretrained(TINY)
        for prompt, expected in zip(COUNTING[:2] + CODE[:1], tiny_reference[:2] + tiny_reference[len(COUNTING):][:1]):
            answer = client.completions.create(model=str(TINY), prompt=prompt, max_tokens=NEW_TOKENS, temperature=0)
            assert answer.choices[0].text == tokenizer.decode(expected, skip_special_tokens=True)
        with pytest.raises(openai.BadRequestError, match="temperature=0.8"):
            client.completions.create(model=str(TINY), prompt=COUNTING[0], max_tokens=4, temperature=0.8)
    finally:
        server.terminate()
        server.wait(timeout=60)
        log.close()


def test_sampling_on_cpu_is_refused_in_one_line(tiny_wedlm):
    from vllm.exceptions import VLLMValidationError

    with pytest.raises(VLLMValidationError, match=r"temperature=0\.8: vLLM's CPU backend returns wrong text .* temperature=0"):
        tiny_wedlm.generate([COUNTING[0]], SamplingParams(temperature=0.8, max_tokens=4), use_tqdm=False)


def test_model_without_mask_id_is_refused_naming_the_option(tmp_path):
    path, _ = random_checkpoint(tmp_path, "llama")
    with pytest.raises(ValueError, match=r"no mask_token_id: pass wedlm_vllm\.speculative_config\(mask_token_id=ID\)"):
        LLM(model=str(path), speculative_config=wedlm_vllm.speculative_config(), **ENGINE)


def test_unsupported_family_is_refused_naming_the_supported_ones(tmp_path):
    from transformers import GPT2Config, GPT2LMHeadModel

    GPT2LMHeadModel(GPT2Config(vocab_size=2048, n_embd=128, n_layer=1, n_head=2, n_positions=1024)).save_pretrained(tmp_path)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(TINY / name, tmp_path / name)
    with pytest.raises(ValueError, match=r"does not support the architecture GPT2LMHeadModel; supported: LlamaForCausalLM"):
        LLM(model=str(tmp_path), speculative_config=wedlm_vllm.speculative_config(mask_token_id=2), **ENGINE)
