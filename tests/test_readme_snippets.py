"""Every fenced block of README.md and docs/*.md runs as written, or says on the line before it why it cannot here.

The line before a block's opening fence holds one marker:
- `<!-- test -->`: this file runs it. A document's python blocks share one namespace; its shell blocks run in
  `bash -e`; all in order, in one temporary folder per document, this environment's `bin/` first on PATH.
- `<!-- skip: REASON -->`: not run here; the reason says why (a server, a GPU, hours of training, output, a
  placeholder) and where the same thing is checked.
- a marker another test file runs (`ELSEWHERE`): the vLLM blocks run in `.ci/run`'s vLLM environment.
"""

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCUMENTS = ["README.md", *sorted(str(path.relative_to(ROOT)) for path in (ROOT / "docs").glob("*.md"))]
ELSEWHERE = {
    "vllm-example": "tests/test_vllm_plugin.py",
    "vllm-server": "tests/test_vllm_plugin.py",
    "vllm-client": "tests/test_vllm_plugin.py",
    "smoke": "tests/test_finetune.py",
}
"""Markers of blocks another test file runs as written: the file named reads the marker."""
RUNNABLE = {"python": "python", "bash": "shell", "sh": "shell", "shell": "shell"}
FENCE = re.compile(r"^(\s*)```(\S*)\s*$")
MARKER = re.compile(r"^\s*<!--\s*(.*?)\s*-->\s*$")
SKIP = re.compile(r"skip: (\S.{11,})")
"""A skip's reason: a dozen characters at least, enough to say why and where."""


@dataclass
class Block:
    document: str
    line: int
    """The 1-based line of its opening fence."""
    language: str
    marker: str | None
    code: str

    @property
    def name(self) -> str:
        return f"{self.document} line {self.line} ({self.language or 'no language'})"


class SnippetFailed(AssertionError):
    """A documented example that does not run as written."""


def blocks(text: str, document: str) -> list[Block]:
    """The fenced blocks of a markdown text, each with the marker on the line before its opening fence."""
    lines, found, number = text.splitlines(), [], 0
    while number < len(lines):
        opening = FENCE.match(lines[number])
        if opening is None:
            number += 1
            continue
        indent, language = opening.groups()
        end = next(n for n in range(number + 1, len(lines)) if lines[n].strip() == "```")
        before = MARKER.match(lines[number - 1]) if number else None
        code = "".join(line.removeprefix(indent) + "\n" for line in lines[number + 1 : end])
        found.append(Block(document, number + 1, language, before and before.group(1), code))
        number = end + 1
    return found


def problem(block: Block) -> str | None:
    """Why a block's marker does not say how it is checked, or None."""
    if block.marker == "test":
        return None if block.language in RUNNABLE else f"{block.name}: `test` on a block this runner cannot run"
    if block.marker in ELSEWHERE:
        runner, reads = ELSEWHERE[block.marker], (f'"{block.marker}"', f"<!-- {block.marker} -->")
        found = any(spelling in (ROOT / runner).read_text() for spelling in reads)
        return None if found else f"{block.name}: {runner} never reads it"
    if block.marker is not None and SKIP.fullmatch(block.marker):
        return None
    return f"{block.name}: no `<!-- test -->`, no `<!-- skip: REASON -->` and no marker of {sorted(ELSEWHERE)} before it"


def document_blocks(document: str) -> list[Block]:
    return blocks((ROOT / document).read_text(), document)


def shell_environment() -> dict:
    """A user's shell with this environment activated: its `python`, `pip` and `wedlm-hf` first on PATH."""
    return dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")


def run_blocks(found: list[Block], folder: Path) -> None:
    """Run the `test` blocks in order, shell blocks in `folder` (python blocks in the current folder, which the test
    sets to the same); the first that fails raises `SnippetFailed` naming it."""
    namespace = {"__name__": "__snippet__"}
    for block in (b for b in found if b.marker == "test"):
        if RUNNABLE[block.language] == "python":
            try:
                exec(compile(block.code, block.name, "exec"), namespace)
            except Exception as error:
                raise SnippetFailed(f"{block.name} failed: {error!r}\n{block.code}") from error
            continue
        result = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", block.code], cwd=folder, capture_output=True,
                                text=True, env=shell_environment(), timeout=600)
        if result.returncode != 0:
            raise SnippetFailed(f"{block.name} exited {result.returncode}:\n{block.code}{result.stderr[-3000:]}")


def test_every_block_runs_or_says_why_not():
    problems = [problem(block) for document in DOCUMENTS for block in document_blocks(document)]
    assert [p for p in problems if p] == []


@pytest.mark.parametrize(
    "document", [d for d in DOCUMENTS if any(block.marker == "test" for block in document_blocks(d))]
)
def test_document_examples_run(document, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    try:
        run_blocks(document_blocks(document), tmp_path)
    except SnippetFailed as failure:
        pytest.fail(str(failure), pytrace=False)


BROKEN = """# A page

<!-- test -->
```python
total = 1 + 1
```

<!-- test -->
```bash
python -c "import sys; sys.exit(total)"
```

<!-- test -->
```bash
touch after-the-broken-block
```

```python
print("unmarked")
```

<!-- skip: later -->
```python
print("a reason too short to say where it is checked")
```
"""


def test_a_broken_example_fails_the_runner_and_an_unmarked_one_the_check(tmp_path):
    """The shell block uses a name only the python block defined: it fails, the runner names it and stops."""
    found = blocks(BROKEN, "broken.md")
    with pytest.raises(SnippetFailed, match=r"broken\.md line 9 \(bash\) exited 1"):
        run_blocks(found, tmp_path)
    assert list(tmp_path.iterdir()) == []
    assert [problem(block) for block in found] == [
        None, None, None,
        "broken.md line 18 (python): no `<!-- test -->`, no `<!-- skip: REASON -->` and no marker of "
        f"{sorted(ELSEWHERE)} before it",
        "broken.md line 23 (python): no `<!-- test -->`, no `<!-- skip: REASON -->` and no marker of "
        f"{sorted(ELSEWHERE)} before it",
    ]
    with pytest.raises(SnippetFailed, match=r"broken\.md line 4 \(python\) failed: NameError"):
        run_blocks([Block("broken.md", 4, "python", "test", "print(undefined)\n")], tmp_path)


def set_up_commands() -> list[str]:
    """The README's two set-up commands, which docs/install.md repeats: the try-it one, then the test one."""
    commands = [b.code.strip() for b in document_blocks("README.md") if b.code.startswith("python3 -m venv .venv")]
    assert len(commands) == 2 and document_blocks("docs/install.md")[0].code.strip() == "\n".join(commands)
    return commands


def test_readme_set_up_commands_are_what_ci_runs_and_the_first_decodes(tmp_path):
    """The README marks its set-up commands skip: `.ci/run` makes the same venv and runs the test command's steps
    (pip quieter, the venv named `.venv-ci`); the try-it command installs less and runs `generate`, as written,
    here, printing the statistics line the README shows (but for tokens/s)."""
    try_it, test = (command.split(" && ") for command in set_up_commands())
    ci = {
        re.sub(r"^python -m (pip install) -q", r"\1", line).replace(".venv-ci", ".venv").split("  #")[0].strip()
        for line in (ROOT / ".ci" / "run").read_text().splitlines()
    }
    assert [step for step in test if step not in ci] == []
    assert try_it[:3] == test[:3] and try_it[3] == "pip install -e ." and test[3] == 'pip install -e ".[dev]"'
    assert try_it[4].startswith("wedlm-hf generate ")
    result = subprocess.run(["bash", "-e", "-c", try_it[4]], cwd=tmp_path, capture_output=True, text=True,
                            env=shell_environment(), timeout=300)
    assert result.returncode == 0, result.stderr
    shown = re.search(r"`(\[wedlm\] [^`]*)`", (ROOT / "README.md").read_text()).group(1)
    speed = re.compile(r"[\d.]+ tokens/s")
    assert speed.sub("", " ".join(shown.split())) == speed.sub("", result.stdout.splitlines()[-1])


def test_ecosystem_doc_runs_its_examples():
    assert sum(block.marker == "test" for block in document_blocks("docs/ecosystem.md")) >= 8
