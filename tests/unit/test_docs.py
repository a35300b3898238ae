"""The documentation a reader of a clone has: links that resolve, a short path from the README
to the code and to the runbooks, a runbook for every alert, a module table in each package."""

import re
from collections import deque
from pathlib import Path

import pytest

from echelon.observe import catalog

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "services" / "echelon"
# Written by other parts of the work; linked before they land, so they may be absent.
PLANNED = {ROOT / "docs" / n for n in ("security.md", "filters.md", "cli.md")}
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
# Package folders whose README.md must list every module (tools/ and v1/ are generated or tiny).
TABLED = ("core", "runtime", "dataplane", "agent", "agent/durable", "router", "matcher", "membership",
          "client", "cli", "replan", "observe", "launch")


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
    return {slug(m.group(1)) for m in re.finditer(r"^#+ +(.+)$", text, flags=re.M)}


def links(path: Path) -> list[tuple[Path, str]]:
    """(target file, anchor) of every relative link in a Markdown file."""
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
    out = []
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target):
            continue  # http:, https:, mailto:
        file, _, anchor = target.partition("#")
        out.append(((path.parent / file).resolve() if file else path, anchor))
    return out


def documents() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "loadtest" / "README.md",
            *sorted(PACKAGE.rglob("README.md"))]


@pytest.mark.parametrize("doc", documents(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_link_resolves(doc):
    for target, anchor in links(doc):
        if target in PLANNED and not target.exists():
            continue
        assert target.exists(), f"{doc.relative_to(ROOT)} links to {target} which does not exist"
        if anchor and target.suffix == ".md":
            assert anchor in anchors(target), f"{doc.relative_to(ROOT)}: no heading #{anchor} in {target.name}"


def hops(start: Path, goal: Path, anchor: str = "") -> int | None:
    """The fewest links from start to goal (and its anchor), following Markdown files only."""
    seen, todo = {start}, deque([(start, 0)])
    while todo:
        doc, depth = todo.popleft()
        for target, a in links(doc):
            if target == goal and (not anchor or a == anchor):
                return depth + 1
            if target.suffix == ".md" and target.exists() and target not in seen:
                seen.add(target)
                todo.append((target, depth + 1))
    return None


def test_the_readme_reaches_the_rank_rule_in_three_links():
    lbdd = PACKAGE / "core" / "lbdd.py"
    assert (n := hops(ROOT / "README.md", lbdd)) is not None and n <= 3, n
    # ... and that file is where LBDD's rank rule is: the rank and the slice of the next bucket.
    code = lbdd.read_text()
    assert "def rank(self, key: str)" in code and "return pos * n_next // n_self" in code


def test_the_readme_reaches_the_dead_member_runbook_in_three_links():
    operations = ROOT / "docs" / "operations.md"
    assert (n := hops(ROOT / "README.md", operations, "echelonmemberdead")) is not None and n <= 3, n


def test_every_alert_has_a_runbook_and_links_it():
    runbooks = anchors(ROOT / "docs" / "operations.md")
    for alert in catalog.ALERTS:
        page, _, anchor = alert.runbook_url.partition("#")
        assert (ROOT / page).exists() and anchor in runbooks, f"{alert.alert}: no section {alert.runbook_url}"


def test_the_readme_needs_nothing_outside_the_repository():
    text = (ROOT / "README.md").read_text()
    assert "../shared" not in text and "DESIGN.md" not in text


@pytest.mark.parametrize("folder", TABLED)
def test_each_package_readme_lists_its_modules(folder):
    readme = PACKAGE / folder / "README.md"
    assert readme.exists(), f"services/echelon/{folder}/README.md is missing"
    listed = set(re.findall(r"^\| `([\w/]+\.py)`", readme.read_text(), flags=re.M))
    modules = {p.name for p in (PACKAGE / folder).glob("*.py") if p.name not in ("__init__.py", "__main__.py")}
    assert listed == modules, (f"services/echelon/{folder}/README.md: add {sorted(modules - listed)}, "
                               f"drop {sorted(listed - modules)}")


def test_comments_cite_docs_not_issue_numbers_or_notes_outside_the_repository():
    """A reader of a clone can follow a docs/ section; an issue number or the project's
    shared notes (DESIGN.md, ALGORITHMS.md, papers/) are not in the repository."""
    pattern = re.compile(r"\b[Ii]ssues? \d+\b|\bDESIGN\.md\b|\bALGORITHMS\.md\b|\bpapers/[a-z*-]+\.txt")
    found = []
    for top in ("services", "loadtest", "tests", "deploy"):
        for path in sorted((ROOT / top).rglob("*")):
            if path.suffix not in (".py", ".tpl", ".yaml") or path == Path(__file__) or "/v1/" in str(path):
                continue
            for n, line in enumerate(path.read_text().splitlines(), 1):
                if pattern.search(line):
                    found.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    assert not found, "cite the docs/ section instead:\n" + "\n".join(found)
