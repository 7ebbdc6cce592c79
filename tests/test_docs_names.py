"""docs/design.md and docs/extending.md name real things: every dotted fdlit name imports, every file
they list exists, and every hook and context they describe is on the classes they name."""

import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "docs" / "design.md", ROOT / "docs" / "extending.md"]


def resolves(dotted: str) -> bool:
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        try:
            for name in parts[cut:]:
                obj = getattr(obj, name)
        except AttributeError:
            return False
        return True
    return False


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_dotted_fdlit_name_imports(doc):
    names = set(re.findall(r"`(fdlit(?:\.[A-Za-z_][A-Za-z0-9_]*)+)", doc.read_text()))
    assert names, doc
    missing = sorted(n for n in names if not resolves(n))
    assert not missing, f"{doc.name} names {missing}"


def test_every_module_the_design_lists_exists():
    text = (ROOT / "docs" / "design.md").read_text()
    block = text.split("fdlit/federation/\n", 1)[1].split("```", 1)[0]
    files = re.findall(r"^\s+([a-z_]+\.py)\b", block, flags=re.M)
    assert len(files) >= 10
    assert [f for f in files if not (ROOT / "fdlit" / "federation" / f).exists()] == []


def test_the_hooks_and_contexts_extending_describes_are_the_contract():
    from fdlit.methods import base

    text = (ROOT / "docs" / "extending.md").read_text()
    table = text.split("| hook | when | gets | returns |", 1)[1].split("\n\n", 1)[0]
    rows = re.findall(r"^\| `([a-z_]+)\(ctx\)` \| [^|]+ \| `([A-Za-z]+)` \|", table, flags=re.M)
    assert {hook for hook, _ in rows} == {"setup", "upload", "receive", "distillation_set", "loss"}
    for hook, context in rows:
        assert callable(getattr(base.ClientPart, hook)), hook
        assert isinstance(getattr(base, context), type), context
    for field in ("phase", "logits", "target", "base", "client", "state", "weight"):
        assert field in base.LossContext.__dataclass_fields__
    for name in re.findall(r"`ctx\.info\.([a-z_]+)", text):  # the FederationInfo members it tells authors to use
        assert hasattr(base.FederationInfo, name), name


def test_the_readme_is_for_users_and_stays_short():
    """Details live in docs/: the README stays at most 1,500 words, and every page it links exists."""
    text = (ROOT / "README.md").read_text()
    assert len(text.split()) <= 1500
    links = re.findall(r"\]\(([^)#]+)", text)
    assert "docs/README.md" in links and [link for link in links if not link.startswith("http")
                                          and not (ROOT / link).exists()] == []


def test_the_docs_index_lists_every_page_once_and_only_pages_that_exist():
    links = re.findall(r"^- \[[^]]+\]\(([^)]+)\): \S", (ROOT / "docs" / "README.md").read_text(), flags=re.M)
    pages = sorted(p.name for p in (ROOT / "docs").glob("*.md") if p.name != "README.md")
    assert sorted(links) == pages
