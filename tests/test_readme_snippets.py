"""The documentation's code runs: every ```python block of docs/ecosystem.md and docs/serving.md, and every
README.md block marked
with `<!-- test -->` on the line before, executed in order in one namespace per document."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BLOCK = re.compile(r"^```python\n(.*?)^```", flags=re.MULTILINE | re.DOTALL)
MARKED_BLOCK = re.compile(r"^<!-- test -->\n```python\n(.*?)^```", flags=re.MULTILINE | re.DOTALL)
DOCUMENTS = {"docs/ecosystem.md": BLOCK, "docs/serving.md": BLOCK, "README.md": MARKED_BLOCK}


def snippets(document: str) -> list[str]:
    path = ROOT / document
    return DOCUMENTS[document].findall(path.read_text()) if path.exists() else []


@pytest.mark.parametrize("document", sorted(DOCUMENTS))
def test_document_snippets_run(document, tmp_path, monkeypatch):
    blocks = snippets(document)
    if not blocks:
        pytest.skip(f"{document} has no tested python blocks")
    monkeypatch.chdir(tmp_path)
    namespace = {"__name__": "__snippet__"}
    for number, code in enumerate(blocks, start=1):
        try:
            exec(compile(code, f"{document} python block {number}", "exec"), namespace)
        except Exception as error:
            pytest.fail(f"{document} python block {number} failed: {error!r}\n{code}")


def test_ecosystem_doc_has_snippets():
    assert len(snippets("docs/ecosystem.md")) >= 8
