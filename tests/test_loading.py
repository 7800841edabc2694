"""One loader for every command: a named model, an adapter folder and a GGUF file load the same way through
`generate` (one prompt and `--input`), `bench` and `export`; an unknown name fails at once, naming the known ones."""

import json
from pathlib import Path

import pytest
import torch
import transformers
from test_ecosystem import build_tokenizer
from tiny_models import MASK_ID, tiny_model

import wedlm_hf
from wedlm_hf.loading import NAMED_MODELS, load_model_and_tokenizer
from wedlm_hf.loading.peft_compat import peft_deprecations_silenced
from wedlm_hf_cli import main

PROMPT = "w10 w11 w12 w13"
TOKENS = 8


@pytest.fixture(scope="module")
def adapter(tmp_path_factory) -> Path:
    """A tiny PEFT LoRA adapter (non-zero, so it changes the output) over a tiny Llama saved in its own folder."""
    peft = pytest.importorskip("peft")
    base_folder = tmp_path_factory.mktemp("base")
    base = tiny_model("llama", peak=40)
    base.config.mask_token_id = MASK_ID
    base.save_pretrained(base_folder)
    build_tokenizer().save_pretrained(base_folder)
    torch.manual_seed(1)
    lora = peft.LoraConfig(r=2, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    folder = tmp_path_factory.mktemp("adapter")
    with peft_deprecations_silenced():
        peft.get_peft_model(base, lora).save_pretrained(folder)
    config = json.loads((folder / "adapter_config.json").read_text())
    (folder / "adapter_config.json").write_text(json.dumps({**config, "base_model_name_or_path": str(base_folder)}))
    return folder


def reference(name: str) -> str:
    """What `model.generate` gives for PROMPT with the model `name` stands for, loaded through the library."""
    model, tokenizer = load_model_and_tokenizer(name)
    model = wedlm_hf.enable(model)
    inputs = tokenizer(PROMPT, return_tensors="pt")
    output = model.generate(**inputs, max_new_tokens=TOKENS, decoding="wedlm")
    return tokenizer.decode(output[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True)


def generate_one(capsys, name: str) -> str:
    capsys.readouterr()
    assert main(["generate", "--model", name, "--max-new-tokens", str(TOKENS), PROMPT]) == 0, capsys.readouterr().err
    return capsys.readouterr().out.rsplit("\n", 2)[0]


def generate_batch(capsys, tmp_path: Path, name: str, *extra: str) -> list[str]:
    source, output = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    source.write_text(json.dumps({"id": 1, "prompt": PROMPT}) + "\n")
    argv = ["generate", "--model", name, "--input", str(source), "--output", str(output), "--overwrite", "--no-progress"]
    capsys.readouterr()
    assert main([*argv, "--max-new-tokens", str(TOKENS), *extra]) == 0, capsys.readouterr().err
    return [json.loads(line)["continuation"] for line in output.read_text().splitlines()]


@pytest.mark.parametrize("kind", ["named", "adapter"])
def test_generate_and_batch_give_the_loaded_model_output(kind, adapter, capsys, tmp_path):
    name = "wedlm-tiny-code" if kind == "named" else str(adapter)
    expected = reference(name)
    assert expected  # something to compare
    assert generate_one(capsys, name) == expected
    assert generate_batch(capsys, tmp_path, name) == [expected]


def test_adapter_output_differs_from_its_base(adapter):
    base = json.loads((adapter / "adapter_config.json").read_text())["base_model_name_or_path"]
    assert reference(str(adapter)) != reference(base)  # the adapter is merged in, not dropped


@pytest.mark.parametrize("kind", ["named", "adapter"])
def test_bench_runs_on_the_loaded_model(kind, adapter, capsys, tmp_path):
    name = "wedlm-tiny-code" if kind == "named" else str(adapter)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"prompt": PROMPT}) + "\n")
    argv = ["bench", "--model", name, "--prompts", str(prompts), "--num-prompts", "1", "--max-new-tokens", "4",
            "--repeats", "1", "--thresholds", "none", "--arms", "ar,wedlm", "--lengths", "", "--no-progress",
            "--json", str(tmp_path / "bench.json")]
    capsys.readouterr()
    assert main(argv) == 0, capsys.readouterr().err
    sets = json.loads((tmp_path / "bench.json").read_text())["sets"]
    assert {row["arm"] for rows in sets.values() for row in rows} >= {"ar", "wedlm@1slot"}


def test_export_writes_the_loaded_weights(adapter, tmp_path, capsys):
    from transformers import AutoModelForCausalLM

    merged, _ = load_model_and_tokenizer(str(adapter))
    assert main(["export", str(tmp_path / "recipe"), "--custom-generate", "--model", str(adapter)]) == 0
    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "recipe")
    for name, tensor in merged.state_dict().items():
        torch.testing.assert_close(exported.state_dict()[name], tensor)
    assert main(["export", str(tmp_path / "named"), "--model", "wedlm-tiny-code"]) == 0
    assert (tmp_path / "named" / "model.safetensors").is_file()


def test_gguf_model_through_batch_mode(capsys, tmp_path):
    pytest.importorskip("gguf", reason="GGUF loading needs the `real` extra: pip install 'wedlm-hf[real]'")
    texts = generate_batch(capsys, tmp_path, "smollm2", "--lossless", "--mask-token-id", "0", "--max-new-tokens", "4")
    assert len(texts) == 1 and texts[0]


@pytest.mark.parametrize("name,hint", [
    ("smollm2-wedlmm", "(did you mean 'smollm2-wedlm'?)"),
    ("nobody/no-such-model", "HF_HUB_OFFLINE"),
])
@pytest.mark.parametrize("batch", [False, True])
def test_unknown_model_fails_at_once_with_the_known_names(name, hint, batch, capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    source = tmp_path / "in.jsonl"
    source.write_text(json.dumps({"prompt": PROMPT}) + "\n")
    argv = ["--input", str(source), "--output", str(tmp_path / "out.jsonl")] if batch else [PROMPT]
    capsys.readouterr()

    def no_loading(*args, **kwargs):  # the name is refused before transformers would retry it against the Hub
        raise AssertionError("from_pretrained was called")

    monkeypatch.setattr(transformers.AutoConfig, "from_pretrained", no_loading)
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", no_loading)
    assert main(["generate", "--model", name, *argv]) == 1
    err = capsys.readouterr().err
    known = f"unknown model {name!r}; named models: {', '.join(NAMED_MODELS)}"
    assert err.startswith(f"wedlm-hf generate: error: {known}") and hint in err and len(err.splitlines()) == 1, err


def test_help_lists_the_named_models(capsys):
    with pytest.raises(SystemExit):
        main(["generate", "--help"])
    assert ", ".join(NAMED_MODELS) in " ".join(capsys.readouterr().out.split())


def test_named_model_missing_its_extras_names_the_install(monkeypatch, capsys):
    import importlib.util

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "peft" else find_spec(name, *a))
    capsys.readouterr()
    assert main(["generate", "--model", "smollm2-wedlm", PROMPT]) == 1
    err = capsys.readouterr().err
    assert err == "wedlm-hf generate: error: the model 'smollm2-wedlm' needs peft: pip install 'wedlm-hf[real,finetune]'\n"


def test_loading_an_adapter_prints_no_warning(adapter, capsys):
    """PEFT's use of transformers' deprecated gradient-checkpointing API is nothing a user can act on."""
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        generate_one(capsys, str(adapter))
    assert [str(w.message) for w in caught if issubclass(w.category, (FutureWarning, DeprecationWarning))] == []


@pytest.mark.parametrize("name", ["wedlm-tiny-code", "smollm2-wedlm"])
def test_the_packaged_checkpoint_files_are_enough_to_load(name, tmp_path):
    """The wheel ships only the checkpoint files pyproject.toml's package-data patterns match: loading reads no other."""
    import fnmatch
    import shutil
    import tomllib

    from wedlm_hf.loading.names import EXTRAS

    for module in EXTRAS.get(name, ("", ()))[1]:
        pytest.importorskip(module, reason=f"{name} needs the extras {EXTRAS[name][0]}")
    root = Path(wedlm_hf.__file__).parent
    pyproject = tomllib.loads((root.parent / "pyproject.toml").read_text())
    patterns = pyproject["tool"]["setuptools"]["package-data"]["wedlm_hf"]
    source = Path(NAMED_MODELS[name]())
    copy = tmp_path / name
    copy.mkdir()
    for path in source.iterdir():
        if any(fnmatch.fnmatch(str(path.relative_to(root)), pattern) for pattern in patterns):
            shutil.copy(path, copy / path.name)
    assert not (copy / "training_log.json").exists() and not (copy / "finetune_summary.json").exists()
    model, tokenizer = load_model_and_tokenizer(str(copy))
    inputs = tokenizer(PROMPT, return_tensors="pt")
    expected, _ = load_model_and_tokenizer(name)
    torch.testing.assert_close(model(**inputs).logits, expected(**inputs).logits)
