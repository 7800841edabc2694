"""Exported remote code is model definition and decoding only: no network, no eval/exec, no file or process access."""

import ast

import pytest

from wedlm_hf.hub.export import export_custom_generate, export_model_folder

ALLOWED_IMPORTS = {
    "torch",
    "transformers",
    "huggingface_hub",  # its config dataclass helpers, which transformers' own configs use
    "collections",
    "contextvars",  # the mask slots of the forward in progress, per thread (generation/mask_slots.py)
    "copy",
    "dataclasses",
    "datetime",  # the date a forward-cost profile was measured (generation/cost_profile.py)
    "functools",
    "inspect",
    "math",
    "numbers",
    "re",
    "statistics",  # medians of a forward-cost profile's timings
    "time",  # its clock (perf_counter)
    "typing",
}
FORBIDDEN_CALLS = {"eval", "exec", "compile", "__import__", "open", "getattr_static", "system", "popen", "urlopen"}
FORBIDDEN_NAMES = {"os", "sys", "subprocess", "socket", "requests", "urllib", "http", "shutil", "pathlib", "pickle"}


def exported_sources(tmp_path):
    model_folder = export_model_folder(tmp_path / "model", config_name="WeDLM-8B-Base")
    recipe = export_custom_generate(tmp_path / "recipe")
    return sorted(model_folder.glob("*.py")) + sorted((recipe / "custom_generate").glob("*.py"))


def test_exported_modules_import_only_torch_transformers_and_pure_stdlib(tmp_path):
    sources = exported_sources(tmp_path)
    assert {path.name for path in sources} >= {"modeling_wedlm.py", "configuration_wedlm.py", "decoding.py", "generate.py"}
    for path in sources:
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                roots = {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom):
                roots = set() if node.level else {node.module.split(".")[0]}
            else:
                continue
            assert roots <= ALLOWED_IMPORTS, f"{path.name}:{node.lineno} imports {roots - ALLOWED_IMPORTS}"


@pytest.mark.parametrize("kind", ["calls", "names"])
def test_exported_modules_have_no_dynamic_code_network_or_file_access(tmp_path, kind):
    for path in exported_sources(tmp_path):
        for node in ast.walk(ast.parse(path.read_text())):
            if kind == "calls" and isinstance(node, ast.Call):
                function = node.func
                name = function.id if isinstance(function, ast.Name) else getattr(function, "attr", None)
                assert name not in FORBIDDEN_CALLS, f"{path.name}:{node.lineno} calls {name}"
            if kind == "names" and isinstance(node, ast.Name):
                assert node.id not in FORBIDDEN_NAMES, f"{path.name}:{node.lineno} uses {node.id}"
