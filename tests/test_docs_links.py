"""Every link between the docs pages and the README reaches a file that exists and, with a #fragment, a
heading of that file (GitHub's anchors: lower case, punctuation dropped, spaces as hyphens, repeats -1, -2)."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGES = sorted((ROOT / "docs").glob("*.md")) + [ROOT / "README.md"]
FENCED = re.compile(r"```.*?```", re.S)
LINK = re.compile(r"\]\(([^)#\s]*)(?:#([^)\s]+))?\)")


def github_anchor(heading: str) -> str:
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    found, seen = set(), {}
    for heading in re.findall(r"^#+\s+(.*)$", FENCED.sub("", page.read_text()), flags=re.M):
        slug = github_anchor(heading)
        found.add(slug if slug not in seen else f"{slug}-{seen[slug]}")
        seen[slug] = seen.get(slug, 0) + 1
    return found


def test_the_anchor_rule_is_githubs():
    assert github_anchor("Scale: 100 to 1,000 clients on one CPU") == "scale-100-to-1000-clients-on-one-cpu"
    assert github_anchor("Data-free federated distillation: FD, FedProto") == \
        "data-free-federated-distillation-fd-fedproto"


def test_every_link_between_pages_reaches_its_file_and_heading():
    broken = []
    for page in PAGES:
        for target, fragment in LINK.findall(FENCED.sub("", page.read_text())):
            if target.startswith(("http://", "https://", "mailto:")):
                continue
            path = (page.parent / target).resolve() if target else page
            if not path.exists():
                broken.append(f"{page.name}: {target} (no such file)")
            elif fragment and path.suffix == ".md" and fragment not in anchors(path):
                broken.append(f"{page.name}: {target}#{fragment} (no such heading)")
    assert not broken, "\n".join(broken)
