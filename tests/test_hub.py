"""Shipped checkpoint configs, `wedlm-hf export` (remote code, custom_generate, the refusals of --space) and
`wedlm-hf push` (a model or a Space), offline."""

import copy
import json
import os
import subprocess
import sys
import textwrap
import zipfile

import pytest
import torch
from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM
from patience import PATIENCE_S

import wedlm_hf.hub.push
from test_ecosystem import RecordingStreamer, build_tokenizer
from tiny_models import MASK_ID, tiny_model
from wedlm_hf import WeDLMConfig, WeDLMForCausalLM, enable
from wedlm_hf.cli import main
from wedlm_hf.hub import HUB_CONFIG_NAMES, hub_config_dir
from wedlm_hf.hub.space import SPACE_FILES, wheel_requirements

# name -> (transformers class with the same weights, parameter count in billions, attention bias / q-k norm)
CHECKPOINTS = {
    "WeDLM-7B-Base": (Qwen2Config, Qwen2ForCausalLM, 7.62, False),
    "WeDLM-7B-Instruct": (Qwen2Config, Qwen2ForCausalLM, 7.62, False),
    "WeDLM-8B-Base": (Qwen3Config, Qwen3ForCausalLM, 8.19, True),
    "WeDLM-8B-Instruct": (Qwen3Config, Qwen3ForCausalLM, 8.19, True),
}
SHAPE_KEYS = (
    "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
    "num_key_value_heads", "tie_word_embeddings",
)
PROMPT = torch.tensor([[7, 8, 9, 10]])
GREEDY = dict(do_sample=False, max_new_tokens=24)


def test_every_checkpoint_is_shipped_under_its_published_name():
    assert set(HUB_CONFIG_NAMES) == set(CHECKPOINTS)
    assert all(name.endswith(("-Base", "-Instruct")) for name in HUB_CONFIG_NAMES)


@pytest.mark.parametrize("name", sorted(CHECKPOINTS))
def test_config_matches_qwen_layout_on_meta(name):
    config_class, qwen_class, billions, qk_norm = CHECKPOINTS[name]
    config = WeDLMConfig.from_pretrained(hub_config_dir() / name)
    assert config.qk_norm is qk_norm and config.attention_bias is not qk_norm
    authors_way = json.loads((hub_config_dir() / name / "config.json").read_text())
    del authors_way["qk_norm"]  # the authors' engine reads only attention_bias
    assert WeDLMConfig.from_dict(authors_way).qk_norm is qk_norm
    assert config.rope_parameters["rope_theta"] == 1e6 and config.head_dim == 128
    assert config.mask_token_id == 151665  # the authors' engine, fine-tuning code and both ports agree
    generation = GenerationConfig.from_pretrained(hub_config_dir() / name)
    assert generation.decoding == "wedlm" and generation.mask_token_id == config.mask_token_id
    stop_ids = [151645, 151643] if name.endswith("-Instruct") else 151643  # <|im_end|>, <|endoftext|>
    assert generation.eos_token_id == stop_ids
    with torch.device("meta"):
        ours = WeDLMForCausalLM(config)
        qwen = qwen_class(config_class(**{key: getattr(config, key) for key in SHAPE_KEYS}))
    assert sum(p.numel() for p in ours.parameters()) / 1e9 == pytest.approx(billions, abs=0.01)
    ours_shapes = {key: tuple(value.shape) for key, value in ours.state_dict().items()}
    assert ours_shapes == {key: tuple(value.shape) for key, value in qwen.state_dict().items()}
    assert ("model.layers.0.self_attn.q_norm.weight" in ours_shapes) is qk_norm
    assert ("model.layers.0.self_attn.q_proj.bias" in ours_shapes) is not qk_norm


REMOTE_SCRIPT = textwrap.dedent(
    """
    import json, sys
    sys.modules["wedlm_hf"] = None  # the package must not be needed
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    model_dir, config_dir = sys.argv[1:3]
    model = AutoModelForCausalLM.from_pretrained(model_dir, trust_remote_code=True)
    tokenizer = AutoTokenizer.from_pretrained(model_dir, trust_remote_code=True)
    tokens = model.generate(torch.tensor([[7, 8, 9, 10]]), decoding="wedlm", do_sample=False, max_new_tokens=24)
    config = AutoConfig.from_pretrained(config_dir, trust_remote_code=True)
    print(json.dumps({
        "tokens": tokens[0].tolist(), "module": type(model).__module__, "vocab": len(tokenizer),
        "config_class": type(config).__name__, "config_module": type(config).__module__, "qk_norm": config.qk_norm,
    }))
    """
)


def test_exported_folder_runs_without_the_package(tmp_path):
    model = tiny_model("wedlm", peak=40)
    source = tmp_path / "source"
    model.save_pretrained(source)
    build_tokenizer().save_pretrained(source)
    assert main(["export", str(tmp_path / "model"), "--model", str(source)]) == 0
    assert main(["export", str(tmp_path / "config"), "--config", "WeDLM-8B-Base"]) == 0
    for folder in (tmp_path / "model", tmp_path / "config"):
        config = json.loads((folder / "config.json").read_text())
        assert config["auto_map"]["AutoModelForCausalLM"] == "modeling_wedlm.WeDLMForCausalLM"
        assert "custom_code" in (folder / "README.md").read_text()
        for module in folder.glob("*.py"):
            assert "wedlm_hf" not in module.read_text() and "from .." not in module.read_text(), module
    assert (tmp_path / "model" / "model.safetensors").exists() and not (tmp_path / "config" / "model.safetensors").exists()

    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    env["HF_MODULES_CACHE"] = str(tmp_path / "modules")
    script = tmp_path / "load.py"
    script.write_text(REMOTE_SCRIPT)
    result = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "model"), str(tmp_path / "config")],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=PATIENCE_S,
    )
    assert result.returncode == 0 and result.stdout.strip(), result.stderr[-3000:]
    remote = json.loads(result.stdout.strip().splitlines()[-1])
    assert remote["module"].startswith("transformers_modules") and remote["config_module"].startswith("transformers_modules")
    assert remote["config_class"] == "WeDLMConfig" and remote["qk_norm"] is True and remote["vocab"] == 96
    assert remote["tokens"] == model.generate(PROMPT, decoding="wedlm", **GREEDY)[0].tolist()


def test_custom_generate_repo_on_untouched_llama(tmp_path):
    assert main(["export", str(tmp_path / "recipe"), "--custom-generate"]) == 0
    assert "custom_generate" in (tmp_path / "recipe" / "README.md").read_text()
    llama = tiny_model("llama", peak=40)
    expected = enable(copy.deepcopy(llama)).generate(PROMPT, decoding="wedlm", mask_token_id=MASK_ID, **GREEDY)
    assert not torch.equal(expected, llama.generate(PROMPT, **GREEDY))
    streamer = RecordingStreamer()
    tokens = llama.generate(
        PROMPT, custom_generate=str(tmp_path / "recipe"), trust_remote_code=True, mask_token_id=MASK_ID,
        streamer=streamer, **GREEDY,
    )
    assert torch.equal(tokens, expected)
    assert torch.equal(torch.cat([put.flatten() for put in streamer.puts]), expected[0]) and streamer.ended


@pytest.fixture
def hub_calls(monkeypatch) -> dict:
    """What `wedlm-hf push` asks of the Hub, recorded instead of sent (there is no network here), under a token."""
    calls = {}
    monkeypatch.setenv("HF_TOKEN", "hf_test")
    monkeypatch.setattr(wedlm_hf.hub.push, "create_repo", lambda repo_id, **kw: calls.setdefault("create", (repo_id, kw)))

    def fake_upload(folder_path, repo_id, **kwargs):
        calls["upload"] = (repo_id, sorted(p.name for p in folder_path.iterdir()), kwargs)
        return f"https://huggingface.co/{repo_id}/commit/0"

    monkeypatch.setattr(wedlm_hf.hub.push, "upload_folder", fake_upload)
    return calls


def test_push_uploads_the_export(tmp_path, hub_calls, capsys):
    assert main(["export", str(tmp_path / "out"), "--config", "WeDLM-7B-Base"]) == 0
    assert main(["push", str(tmp_path / "out"), "--repo-id", "me/WeDLM-7B-Base", "--private"]) == 0
    repo_id, options = hub_calls["create"]
    assert repo_id == "me/WeDLM-7B-Base"
    assert options == {"repo_type": "model", "space_sdk": None, "private": True, "token": "hf_test", "exist_ok": True}
    repo_id, files, upload = hub_calls["upload"]
    assert repo_id == "me/WeDLM-7B-Base" and upload["repo_type"] == "model" and upload["token"] == "hf_test"
    assert {"config.json", "generation_config.json", "README.md", "modeling_wedlm.py", "decoding.py"} <= set(files)
    capsys.readouterr()
    assert main(["push", str(tmp_path), "--repo-id", "me/empty"]) == 1  # a user error: one line, no traceback
    assert "not an exported folder" in capsys.readouterr().err


def test_push_uploads_a_space_folder_as_a_gradio_space(tmp_path, hub_calls):
    for name in SPACE_FILES:  # what `wedlm-hf export --space` writes (tests/test_space_export.py runs one)
        (tmp_path / name).write_text("")
    assert main(["push", str(tmp_path), "--repo-id", "me/wedlm-demo"]) == 0
    repo_id, options = hub_calls["create"]
    assert repo_id == "me/wedlm-demo" and options["repo_type"] == "space" and options["space_sdk"] == "gradio"
    assert hub_calls["upload"][1] == sorted(SPACE_FILES) and hub_calls["upload"][2]["repo_type"] == "space"


def test_push_without_a_token_is_refused_in_one_line(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    env = {key: value for key, value in os.environ.items() if key != "HF_TOKEN"}
    result = subprocess.run(
        [sys.executable, "-m", "wedlm_hf.cli", "push", str(tmp_path), "--repo-id", "me/x"],
        capture_output=True, text=True, timeout=PATIENCE_S, env={**env, "HF_HOME": str(tmp_path)},  # no stored token
    )
    assert result.returncode == 1
    assert result.stderr == (
        "wedlm-hf push: error: no Hugging Face token: run `hf auth login` or set HF_TOKEN to a token with write access\n"
    )


@pytest.mark.parametrize(
    "options,message",
    [
        (["--model", "wedlm-tiny"], "--model 'wedlm-tiny': a Space loads a named model (wedlm-tiny-code, smollm2, "),
        (["--model", "wedlm-tiny"], "did you mean 'wedlm-tiny-code'?"),
        (["--model", "{tmp}"], "not a folder of this machine"),
        (["--model", "x.gguf:q4.gguf"], "or a Hub id like 'user/name'"),
        (["--config", "WeDLM-7B-Base", "--repo-id", "me/x"], "--space cannot be combined with --config, --repo-id"),
    ],
)
def test_space_export_refuses_what_a_space_cannot_use(tmp_path, capsys, options, message):
    target = tmp_path / "space"
    code = main(["export", str(target), "--space", *(option.format(tmp=tmp_path) for option in options)])
    err = capsys.readouterr().err
    assert code == 1 and err.startswith("wedlm-hf export: error: ") and err.count("\n") == 1, err
    assert message in err
    assert not target.exists()  # refused before anything was built or written


def test_space_requirements_are_the_wheels_with_the_chosen_extras(tmp_path):
    wheel = tmp_path / "wedlm_hf-0.1.0-py3-none-any.whl"
    metadata = "Name: wedlm-hf\nVersion: 0.1.0\n" + "".join(
        f"Requires-Dist: {line}\n"
        for line in [
            "torch>=2.4", 'gradio==6.31.0; extra == "demo"', 'gguf==0.19.0; extra == "real"',
            'pytest>=8; extra == "test"', 'wedlm-hf[real]; extra == "test"',
        ]
    )
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("wedlm_hf-0.1.0.dist-info/METADATA", metadata)
    assert wheel_requirements(wheel, {"demo"}) == ["torch>=2.4", "gradio==6.31.0"]
    assert wheel_requirements(wheel, {"demo", "real"}) == ["torch>=2.4", "gradio==6.31.0", "gguf==0.19.0"]
