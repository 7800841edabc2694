"""The package's shape (docs/architecture.md): one-way imports in `generation/` and across the package (lazy ones
included), short modules, a short `wedlm_decode`, the WeDLM option names declared once, nothing importable at the
top but `wedlm_hf`, and every command in `wedlm_hf/commands/`."""

import ast
import dataclasses
import inspect
from pathlib import Path

import tomllib

import wedlm_hf.generation
from wedlm_hf.generation import decoding
from wedlm_hf.generation.options import BY_SETTING, KEYWORDS
from wedlm_hf.generation.settings import WeDLMSettings

GENERATION = Path(wedlm_hf.generation.__file__).parent
MOST_LINES = 300


def sibling_imports(path: Path) -> set[str]:
    """Modules of `generation/` that `path` imports anywhere (top level or inside functions)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            if node.module:
                names.add(node.module.split(".")[0])
            else:
                names.update(alias.name for alias in node.names)
    return names


def test_generation_imports_have_no_cycle():
    graph = {path.stem: sibling_imports(path) for path in GENERATION.glob("*.py")}
    state: dict[str, str] = {}

    def visit(module: str, trail: list[str]) -> None:
        if state.get(module) == "done":
            return
        assert state.get(module) != "open", f"import cycle: {' -> '.join(trail + [module])}"
        state[module] = "open"
        for imported in graph.get(module, ()):
            visit(imported, trail + [module])
        state[module] = "done"

    for module in graph:
        visit(module, [])


def test_generation_modules_are_short_and_none_is_named_generate():
    lengths = {path.name: len(path.read_text().splitlines()) for path in GENERATION.glob("*.py")}
    assert "generate.py" not in lengths  # the custom_generate export writes its own
    assert max(lengths.values()) <= MOST_LINES, {name: n for name, n in lengths.items() if n > MOST_LINES}


def test_wedlm_decode_is_short():
    assert len(inspect.getsource(decoding.wedlm_decode).splitlines()) <= 60


def test_option_names_are_declared_once():
    """`wedlm_decode` must name its keywords (transformers passes a callable only those): they are the table's."""
    parameters = inspect.signature(decoding.wedlm_decode).parameters
    wedlm_keywords = {name for name in parameters if name.startswith("wedlm_") or name == "mask_token_id"}
    assert wedlm_keywords == set(KEYWORDS)
    assert {field.name for field in dataclasses.fields(WeDLMSettings)} == set(BY_SETTING)


# --- the whole package ---

PACKAGE = Path(wedlm_hf.__file__).parent
ROOT = PACKAGE.parent
KEPT_AT_TOP = {
    "wedlm_hf_cli.py": "the `wedlm-hf` entry point: importing `wedlm_hf` imports torch, `--help` must not",
    "app.py": "the Hugging Face Spaces entry of the demo, which Spaces looks for at the root (not installed)",
}


PACKAGES_AT_TOP = {
    "wedlm_hf": "the library",
    "wedlm_vllm": "the vLLM plugin: importing `wedlm_hf` needs the package's transformers release, vLLM pins its own",
}


def test_nothing_importable_at_the_top_but_the_two_packages():
    modules = {path.name for path in ROOT.glob("*.py")}
    packages = {path.parent.name for path in ROOT.glob("*/__init__.py")}
    assert modules <= set(KEPT_AT_TOP), modules - set(KEPT_AT_TOP)
    assert packages == set(PACKAGES_AT_TOP), packages
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert setuptools["py-modules"] == ["wedlm_hf_cli"]
    assert setuptools["packages"]["find"]["include"] == [f"{name}*" for name in PACKAGES_AT_TOP]


def test_the_package_root_holds_only_the_api_and_the_cli():
    """A module lives in the subpackage of its callers; the root keeps the public API and `python -m wedlm_hf.cli`."""
    assert {path.name for path in PACKAGE.glob("*.py")} == {"__init__.py", "cli.py"}


def test_every_module_is_short():
    lengths = {str(path.relative_to(ROOT)): len(path.read_text().splitlines()) for path in PACKAGE.rglob("*.py")}
    assert {name: n for name, n in lengths.items() if n > MOST_LINES} == {}


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def package_imports(path: Path, modules: set[str]) -> set[str]:
    """The `wedlm_hf` modules `path` imports anywhere (top level or inside functions), relative imports resolved;
    `from package import name` counts as importing the submodule `name` where there is one."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name.split(".")[0] == "wedlm_hf")
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            elif (node.module or "").split(".")[0] == "wedlm_hf":
                target = node.module
            else:
                continue
            submodules = {f"{target}.{alias.name}" for alias in node.names} & modules
            found.update(submodules or {target})
    return found & modules


def cycles(graph: dict[str, set[str]]) -> list[str]:
    """Every import circle of `graph` found by one depth-first walk, each as "a -> b -> a"."""
    state: dict[str, str] = {}
    found = []

    def visit(module: str, trail: list[str]) -> None:
        if state.get(module) == "done":
            return
        if state.get(module) == "open":
            found.append(" -> ".join(trail[trail.index(module) :] + [module]))
            return
        state[module] = "open"
        for imported in sorted(graph.get(module, ())):
            visit(imported, trail + [module])
        state[module] = "done"

    for module in sorted(graph):
        visit(module, [])
    return found


def module_graph() -> dict[str, set[str]]:
    paths = list(PACKAGE.rglob("*.py"))
    modules = {module_name(path) for path in paths}
    return {module_name(path): package_imports(path, modules) - {module_name(path)} for path in paths}


def test_package_imports_have_no_cycle():
    assert cycles(module_graph()) == []


def subpackage(module: str) -> str:
    """`wedlm_hf.bench.prompts` -> `wedlm_hf.bench`; a module at the package root stands for itself."""
    return ".".join(module.split(".")[:2])


def test_subpackage_imports_have_no_cycle():
    """Packages are layers: no circle between them even where the modules have none (bench's prompts reading
    training's corpus while training's recipe reads bench's prompts), lazy imports included."""
    graph: dict[str, set[str]] = {}
    for module, imported in module_graph().items():
        graph.setdefault(subpackage(module), set()).update(subpackage(name) for name in imported)
    assert cycles({name: targets - {name} for name, targets in graph.items()}) == []


def test_subpackage_cycles_are_found():
    """The check above can fail: a lazy import of training from bench is a circle."""
    graph = {"wedlm_hf.bench": {"wedlm_hf.training"}, "wedlm_hf.training": {"wedlm_hf.bench"}}
    assert cycles(graph) == ["wedlm_hf.bench -> wedlm_hf.training -> wedlm_hf.bench"]


def test_private_transformers_helpers_are_called_in_one_place():
    """transformers has no public API that prepares a generation config's special tokens or builds its processors
    outside `generate()`: the private helpers that do are called only in `prepare_decoding`, the set-up continuous
    batching shares with `wedlm_decode`."""
    private = {"_prepare_special_tokens", "_get_logits_processor"}
    callers = {
        str(path.relative_to(PACKAGE))
        for path in PACKAGE.rglob("*.py")
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Attribute) and node.attr in private
    }
    assert callers == {"generation/decoding.py"}
    source = inspect.getsource(decoding.prepare_decoding)
    assert all(name in source for name in private)


def test_every_command_lives_in_commands():
    """One place for commands: each `wedlm-hf` subcommand is a module of `wedlm_hf/commands/` (arguments and
    output; the logic in the library), and every module there but the shared flags (options, placement) is a
    subcommand."""
    from wedlm_hf_cli import SUBCOMMANDS

    modules = {name: module for name, (module, _help, _extra) in SUBCOMMANDS.items()}
    assert all(module == f"wedlm_hf.commands.{name}" for name, module in modules.items()), modules
    files = {path.stem for path in (PACKAGE / "commands").glob("*.py")} - {"__init__", "options", "placement"}
    assert files - set(SUBCOMMANDS) == {"generate_batch"}  # `generate --input`, a mode of `generate`


def test_exported_code_imports_only_itself_and_modeling_only_the_mixin():
    """`generation/` and `modeling/` are exported flat to the Hub, so they import nothing else of the package; the
    model classes know of decoding only the mixin they inherit (and the version check every exported file runs)."""
    paths = list(PACKAGE.rglob("*.py"))
    modules = {module_name(path) for path in paths}
    for folder in ("generation", "modeling"):
        for path in (PACKAGE / folder).glob("*.py"):
            imported = package_imports(path, modules)
            exported = {m for m in imported if m.startswith(("wedlm_hf.generation", "wedlm_hf.modeling"))}
            assert imported == exported, (path.name, imported - exported)
            if folder == "modeling":
                generation = {m for m in imported if m.startswith("wedlm_hf.generation")}
                assert generation <= {"wedlm_hf.generation.mixin", "wedlm_hf.generation.transformers_version"}
