"""The decoder's shape (docs/architecture.md): one-way imports in `generation/` (lazy ones included), short modules,
a short `wedlm_decode`, and the WeDLM option names declared once."""

import ast
import dataclasses
import inspect
from pathlib import Path

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
