"""`wedlm-hf export`: the transformers version guard of the exported code, the model cards' metadata and sections,
the `custom_generate` layout transformers documents (run through `generate(custom_generate=...)` and as a
self-contained model+recipe repository), file modes and a tokenizer config free of this machine's loading flags."""

import argparse
import copy
import json
import os
import stat
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest
import torch
from huggingface_hub import ModelCard
from test_ecosystem import build_tokenizer
from tiny_models import MASK_ID, tiny_model
from transformers import AutoModelForCausalLM, AutoTokenizer, GPT2Config, GPT2LMHeadModel
from patience import PATIENCE_S

from wedlm_hf import enable
from wedlm_hf.generation.transformers_version import TRANSFORMERS_REQUIREMENT, check_transformers_version
from wedlm_hf.commands import export as export_command
from wedlm_hf.hub import export_custom_generate, export_model_folder
from wedlm_hf.hub.export import RECIPE_REQUIREMENTS, remote_module_sources

REPO = Path(__file__).resolve().parents[1]
PROMPT = torch.tensor([[7, 8, 9, 10]])
GREEDY = dict(do_sample=False, max_new_tokens=24)


@pytest.fixture(scope="module")
def saved_llama(tmp_path_factory) -> Path:
    """A tiny Llama and a tokenizer, saved and so loaded from a path like a user's checkpoint."""
    folder = tmp_path_factory.mktemp("llama")
    tiny_model("llama", peak=40).save_pretrained(folder)
    build_tokenizer().save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def saved_wedlm(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("wedlm")
    tiny_model("wedlm", peak=40).save_pretrained(folder)
    build_tokenizer().save_pretrained(folder)
    return folder


# --- transformers version guard ---


@pytest.mark.parametrize("version", ["5.19.0", "5.24.0", "5.25.0.dev0", "5.99.1"])
def test_version_guard_accepts_the_supported_range(version):
    check_transformers_version(version)


@pytest.mark.parametrize("version", ["4.57.1", "5.18.2", "6.0.0", "nightly"])
def test_version_guard_names_the_range_and_the_fix(version):
    with pytest.raises(ImportError) as error:
        check_transformers_version(version)
    message = str(error.value)
    assert f"transformers {version} is installed" in message
    assert f"pip install 'transformers{TRANSFORMERS_REQUIREMENT}'" in message


def test_version_guard_admits_the_package_dependency():
    """The package installs the tested range; exported code accepts every 5.x from its oldest on (the code runs on
    5.25)."""
    dependencies = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    pinned = [d.split("#")[0].strip() for d in dependencies if d.startswith("transformers")]
    assert pinned == ["transformers>=5.19,<5.26"]
    assert TRANSFORMERS_REQUIREMENT == ">=5.19,<6"
    check_transformers_version("5.19.0")
    check_transformers_version("5.24.0")
    check_transformers_version("5.25.0")


OLD_TRANSFORMERS_SCRIPT = textwrap.dedent(
    """
    import sys
    import torch
    from transformers import AutoConfig

    kind, folder = sys.argv[1:3]
    if kind == "recipe":
        from tiny_models import tiny_model  # imports wedlm_hf, so only here: AutoConfig would prefer its "wedlm"

        model = tiny_model("llama")
    sys.modules["transformers"].__version__ = "4.57.1"  # what the exported code sees on an old install
    try:
        if kind == "model":
            AutoConfig.from_pretrained(folder, trust_remote_code=True)
        else:
            model.generate(torch.tensor([[7, 8]]), custom_generate=folder, trust_remote_code=True, mask_token_id=95)
    except ImportError as error:
        print("ImportError:", error)
    else:
        print("loaded")
    """
)


@pytest.mark.parametrize("kind", ["model", "recipe"])
def test_exported_code_refuses_an_old_transformers_clearly(tmp_path, kind):
    if kind == "model":
        folder = export_model_folder(tmp_path / "export", config_name="WeDLM-8B-Base")
    else:
        folder = export_custom_generate(tmp_path / "export")
    script = tmp_path / "old.py"
    script.write_text(OLD_TRANSFORMERS_SCRIPT)
    env = {**os.environ, "HF_MODULES_CACHE": str(tmp_path / "modules"), "PYTHONPATH": str(REPO / "tests")}
    result = subprocess.run(
        [sys.executable, str(script), kind, str(folder)], cwd=tmp_path, env=env, capture_output=True, text=True,
        timeout=PATIENCE_S,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    last = result.stdout.strip().splitlines()[-1]
    assert last.startswith("ImportError: WeDLM needs transformers>=5.19,<6, but transformers 4.57.1"), last


# --- model cards ---


def _card(folder: Path) -> ModelCard:
    return ModelCard.load(folder / "README.md")


def test_model_folder_card_metadata_sections_and_repo_id(tmp_path):
    folder = export_model_folder(
        tmp_path / "out", config_name="WeDLM-8B-Base", repo_id="me/WeDLM-8B-Base", base_model="org/WeDLM-8B-Base"
    )
    card = _card(folder)
    assert card.data.license == "apache-2.0"
    assert card.data.library_name == "transformers" and card.data.pipeline_tag == "text-generation"
    assert {"wedlm", "custom_code", "arxiv:2512.22737"} <= set(card.data.tags)
    assert card.data.base_model == "org/WeDLM-8B-Base"
    for section in ("## Usage", "## Requirements", "## Limitations"):
        assert section in card.text
    assert 'from_pretrained("me/WeDLM-8B-Base", trust_remote_code=True)' in card.text
    assert f"transformers{TRANSFORMERS_REQUIREMENT}" in card.text
    assert "add the weights" in card.text  # config-only export


def test_card_without_repo_id_or_base_model(tmp_path, saved_wedlm):
    folder = export_model_folder(tmp_path / "wedlm-tiny", model=saved_wedlm, license="mit")
    card = _card(folder)
    assert card.data.license == "mit" and card.data.base_model is None  # a local path is not a Hub id
    assert 'from_pretrained("wedlm-tiny", trust_remote_code=True)' in card.text and "add the weights" not in card.text
    assert (folder / "lossless.py").exists() and not (folder / "reference.py").exists()  # only what the model needs


# --- custom_generate ---

CUSTOM_GENERATE_SECTIONS = (
    "## Base model", "## Model compatibility", "## Additional arguments", "## Output type changes", "## Example usage",
)


def test_custom_generate_layout_and_card(tmp_path):
    repo = export_custom_generate(tmp_path / "recipe", repo_id="me/wedlm-decoding")
    code = repo / "custom_generate"
    assert (code / "generate.py").is_file()
    assert (code / "requirements.txt").read_text().splitlines() == list(RECIPE_REQUIREMENTS)
    assert f"transformers{TRANSFORMERS_REQUIREMENT}" in RECIPE_REQUIREMENTS
    modules = {path.name for path in code.glob("*.py")}
    assert {"generate.py", "mixin.py", "decoding.py", "lossless.py", "transformers_version.py"} <= modules
    assert not modules & {"modeling_wedlm.py", "configuration_wedlm.py", "reference.py"}  # not needed to decode
    assert modules < set(remote_module_sources()) | {"generate.py"}
    assert not any(repo.glob("*.py")) and not (repo / "config.json").exists()  # the code lives in custom_generate/
    card = _card(repo)
    assert "custom_generate" in card.data.tags and "arxiv:2512.22737" in card.data.tags
    positions = [card.text.index(section) for section in CUSTOM_GENERATE_SECTIONS]
    assert positions == sorted(positions)
    for argument in ("mask_token_id", "wedlm_window_size", "wedlm_lossless", "wedlm_stats"):
        assert f"`{argument}`" in card.text
    assert 'custom_generate="me/wedlm-decoding"' in card.text


def test_custom_generate_from_a_local_folder_runs_wedlm(tmp_path, saved_llama):
    repo = export_custom_generate(tmp_path / "recipe")
    llama = AutoModelForCausalLM.from_pretrained(saved_llama)
    expected = enable(copy.deepcopy(llama)).generate(
        PROMPT, decoding="wedlm", mask_token_id=MASK_ID, return_dict_in_generate=True, **GREEDY
    )
    assert not torch.equal(expected.sequences, llama.generate(PROMPT, **GREEDY))  # WeDLM differs from greedy here
    output = llama.generate(
        PROMPT, custom_generate=str(repo), trust_remote_code=True, mask_token_id=MASK_ID,
        return_dict_in_generate=True, **GREEDY,
    )
    assert torch.equal(output.sequences, expected.sequences)
    assert output.wedlm_stats.summary() == expected.wedlm_stats.summary()
    lossless = llama.generate(
        PROMPT, custom_generate=str(repo), trust_remote_code=True, mask_token_id=MASK_ID, wedlm_lossless=True, **GREEDY
    )
    assert torch.equal(lossless, llama.generate(PROMPT, **GREEDY))


def test_custom_generate_with_a_model_is_a_self_contained_repo(tmp_path, saved_llama):
    repo = export_custom_generate(tmp_path / "pair", model=saved_llama, repo_id="me/llama-wedlm")
    assert (repo / "model.safetensors").exists() and (repo / "custom_generate" / "generate.py").exists()
    assert "## Base model\n\nthe model in this repository." in _card(repo).text
    paired = AutoModelForCausalLM.from_pretrained(repo, trust_remote_code=True)  # `generate` becomes the recipe
    tokens = paired.generate(PROMPT, mask_token_id=MASK_ID, **GREEDY)
    expected = enable(AutoModelForCausalLM.from_pretrained(saved_llama)).generate(
        PROMPT, decoding="wedlm", mask_token_id=MASK_ID, **GREEDY
    )
    assert torch.equal(tokens, expected)


def test_custom_generate_refuses_a_wedlm_or_unsupported_model(saved_wedlm, tmp_path):
    with pytest.raises(ValueError, match="export it without --custom-generate"):
        export_custom_generate(tmp_path / "a", model=saved_wedlm)
    gpt2 = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=16, n_head=2))
    with pytest.raises(ValueError, match="no rotary position embedding"):
        export_custom_generate(tmp_path / "b", model=gpt2)


# --- files ---


def _modes(folder: Path) -> dict[str, int]:
    return {str(path.relative_to(folder)): stat.S_IMODE(path.stat().st_mode) for path in folder.rglob("*")}


@pytest.mark.parametrize("kind", ["model", "recipe"])
def test_exported_files_are_world_readable(tmp_path, saved_wedlm, saved_llama, kind):
    if kind == "model":
        folder = export_model_folder(tmp_path / "out", model=saved_wedlm)
    else:
        folder = export_custom_generate(tmp_path / "out", model=saved_llama)
    modes = _modes(folder)
    assert "model.safetensors" in modes
    unreadable = {name: oct(mode) for name, mode in modes.items() if mode & 0o444 != 0o444}
    assert not unreadable
    assert stat.S_IMODE(folder.stat().st_mode) & 0o555 == 0o555


def test_tokenizer_config_has_no_local_loading_keys(tmp_path, saved_wedlm):
    AutoTokenizer.from_pretrained(saved_wedlm).save_pretrained(tmp_path / "plain")
    plain = json.loads((tmp_path / "plain" / "tokenizer_config.json").read_text())
    assert "is_local" in plain  # what transformers writes for a tokenizer loaded from a path
    folder = export_model_folder(tmp_path / "out", model=saved_wedlm)
    exported = json.loads((folder / "tokenizer_config.json").read_text())
    assert not {"is_local", "local_files_only"} & set(exported)
    assert {key: value for key, value in plain.items() if key not in ("is_local", "local_files_only")} == exported
    assert AutoTokenizer.from_pretrained(folder).mask_token == "[MASK]"


# --- command line ---


def _export_args(directory: Path, **flags) -> argparse.Namespace:
    """`wedlm-hf export DIRECTORY --flag value ...` parsed; a flag given True is a switch."""
    parser = argparse.ArgumentParser()
    export_command.register(parser)
    argv = [str(directory)]
    for name, value in flags.items():
        argv += [f"--{name}"] if value is True else [f"--{name}", value]
    return parser.parse_args(argv)


@pytest.mark.parametrize(
    "flags, message",
    [
        ({}, "pass one of --config NAME, --model PATH_OR_ID or --custom-generate"),
        ({"config": "WeDLM-8B-Base", "model": "x"}, "pass one of"),
        ({"config": "WeDLM-8B-Base", "custom-generate": True}, "cannot be combined"),
    ],
)
def test_export_flags_that_do_not_fit_together_are_refused(tmp_path, flags, message):
    with pytest.raises(ValueError, match=message):
        export_command.run(_export_args(tmp_path / "out", **flags))
    assert not (tmp_path / "out").exists()


def test_export_command_writes_a_model_and_recipe_pair(tmp_path, saved_llama, capsys):
    flags = {"custom-generate": True, "model": str(saved_llama), "repo-id": "me/pair", "license": "mit"}
    args = _export_args(tmp_path / "pair", **flags)
    assert export_command.run(args) == 0
    assert capsys.readouterr().out.strip() == f"wrote {tmp_path / 'pair'}"
    card = _card(tmp_path / "pair")
    assert card.data.license == "mit" and 'from_pretrained("me/pair", trust_remote_code=True)' in card.text
    assert (tmp_path / "pair" / "custom_generate" / "requirements.txt").exists()


def test_base_model_comes_from_the_hub_id_a_model_was_loaded_from(tmp_path, saved_llama):
    llama = AutoModelForCausalLM.from_pretrained(saved_llama)
    assert _card(export_custom_generate(tmp_path / "a", model=llama)).data.base_model is None  # a local folder
    llama.config.name_or_path = "org/tiny-llama"  # what from_pretrained("org/tiny-llama") records
    assert _card(export_custom_generate(tmp_path / "b", model=llama)).data.base_model == "org/tiny-llama"
    card = _card(export_custom_generate(tmp_path / "c", model=llama, base_model="org/other"))
    assert card.data.base_model == "org/other" and "`org/other`, included in this repository." in card.text


def test_custom_generate_refuses_what_it_cannot_honour(tmp_path, saved_llama):
    repo = export_custom_generate(tmp_path / "recipe")
    llama = AutoModelForCausalLM.from_pretrained(saved_llama)
    recipe = dict(custom_generate=str(repo), trust_remote_code=True, mask_token_id=MASK_ID, max_new_tokens=4)
    with pytest.raises(ValueError, match="assistant_model"):
        llama.generate(PROMPT, assistant_model=copy.deepcopy(llama), **recipe)
    with pytest.raises(ValueError, match="num_beams"):
        llama.generate(PROMPT, num_beams=2, **recipe)
