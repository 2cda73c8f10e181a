"""The documentation stays true to the code and to itself: the key reference is what the dataclasses say,
every relative link lands on a file (and heading) that exists, and every published result is named by a
page."""

from __future__ import annotations

import re
from pathlib import Path

from grpo_cli.recipe import reference

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
PAGES = [
    ROOT / "README.md",
    *sorted((ROOT / "docs").glob("*.md")),
    ROOT / "benchmarks" / "README.md",
    ROOT / "benchmarks" / "distributed" / "README.md",
    ROOT / "benchmarks" / "qlora" / "README.md",
    *sorted(RESULTS.glob("*/NOTES.md")),
]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.DOTALL | re.MULTILINE)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = FENCE.sub("", page.read_text(encoding="utf-8"))
    return {slug(line.lstrip("#")) for line in text.splitlines() if line.startswith("#")}


def test_the_key_reference_is_written_from_the_dataclasses():
    """docs/recipes.md's key tables are what `make docs` writes from grpo_cli/arguments.py."""
    text = reference.DOC.read_text(encoding="utf-8")
    assert reference.updated(text) == text, "docs/recipes.md is stale: run `make docs`"
    assert "`dynamic_sampling`" in text and "`report_to`" in text


def test_every_keys_help_is_shown_whole():
    """The schema keeps a help's first 300 characters: grpo's own keys say all they have to say within them."""
    import dataclasses

    from grpo_cli.arguments import OWN_ARGUMENTS

    long = {f.name: len(" ".join(str(f.metadata.get("help", "")).split()))
            for group in OWN_ARGUMENTS.values() for f in dataclasses.fields(group)}
    assert {name: n for name, n in long.items() if n > 300} == {}


def test_every_relative_link_resolves():
    broken = []
    for page in PAGES:
        for target in LINK.findall(FENCE.sub("", page.read_text(encoding="utf-8"))):
            if re.match(r"[a-z]+:", target):
                continue  # http(s), mailto
            path, _, anchor = target.partition("#")
            resolved = (page.parent / path).resolve() if path else page
            if not resolved.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target}")
            elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such heading)")
    assert not broken, broken


def test_the_user_guides_stay_short():
    assert len((ROOT / "README.md").read_text().splitlines()) <= 250
    assert len((ROOT / "benchmarks" / "README.md").read_text().splitlines()) <= 300


def test_every_result_is_in_a_dated_folder_and_named_by_a_page():
    """benchmarks/results/<machine>-<date>/<what>.<ext>, each named by a page (its folder's NOTES.md at
    least)."""
    text = "\n".join(page.read_text(encoding="utf-8") for page in PAGES)
    for path in sorted(p for p in RESULTS.rglob("*") if p.is_file()):
        folder = path.relative_to(RESULTS).parts[0]
        assert re.fullmatch(r"(cpu|h[12]00(-x\d+)?)-\d{4}-\d{2}-\d{2}", folder), path
        assert len(path.relative_to(RESULTS).parts) == 2, path
        assert path.name == "NOTES.md" or path.name in text, f"{path.relative_to(ROOT)} is named by no page"
