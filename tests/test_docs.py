"""README.md and docs/: every name of the package and every repository path they mention exists.

The site's own build (`mkdocs build --strict`, in .ci/run) checks its links and docstrings; the
code blocks run in tests/test_readme.py. Here: `fjp.<name>` / `fedjax_pals.<name>` (in code or
in prose) resolves to an attribute of the package, and a path into the repository
(`fedjax_pals/...`, `configs/...`, `scripts/...`, ..., `BUILD_NOTES.md`) exists.
"""

import glob
import importlib
import os
import re

import pytest

from test_readme import DOC_PAGES, ROOT

# `fjp.a.b` or `fedjax_pals.a.b` (not a file name: fedjax_pals.py, nor part of another name).
NAME = re.compile(r"(?<![\w/.-])(fjp|fedjax_pals)((?:\.[A-Za-z_]\w*)+)(?![\w/-])")
# A path that starts at a top-level entry of the repository.
TOP = ("fedjax_pals/", "experiments/", "configs/", "examples/", "scripts/", "tests/", "docs/",
       "requirements/", ".ci/")
TOP_FILES = ("README.md", "BUILD_NOTES.md", "CHANGELOG.md", "REPRODUCTION.md", "pyproject.toml",
             "mkdocs.yml")
PATH = re.compile(r"(?<![\w/.$~-])((?:%s)[\w./-]*|(?:%s))(?![\w*<{-])" % (
    "|".join(re.escape(t) for t in TOP), "|".join(re.escape(f) for f in TOP_FILES)))


# Every page: README.md, the nav's pages, and any other page under docs/ (mkdocs.yml's strict
# build refuses a page left out of the nav, but this test does not wait for the build).
PAGES = DOC_PAGES + sorted(
    os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "docs", "**", "*.md"),
                                                recursive=True)
    if os.path.relpath(p, ROOT) not in DOC_PAGES)

# Mentions that look like names of the package and are not.
NOT_NAMES = {"workdir": "the MLflow tag fedjax_pals.workdir (docs/guide/running.md)"}


def _text(page: str) -> str:
    with open(os.path.join(ROOT, page)) as f:
        return f.read()


def _resolves(dotted: str) -> bool:
    import fedjax_pals

    obj = fedjax_pals
    for i, part in enumerate(dotted.split(".")):
        if hasattr(obj, part):
            obj = getattr(obj, part)
            continue
        try:  # a submodule not imported by the package's __init__
            obj = importlib.import_module("fedjax_pals." + ".".join(dotted.split(".")[: i + 1]))
        except ImportError:
            return False
    return True


def names_of(text: str) -> set[str]:
    return {match.group(2)[1:].rstrip(".") for match in NAME.finditer(text)}


def paths_of(text: str) -> set[str]:
    return {match.group(1).rstrip(".,;:") for match in PATH.finditer(text)}


def test_the_patterns_find_names_and_paths_and_leave_the_rest():
    text = ("`fjp.fedpals_weights(S, T)` and fedjax_pals.experiment.shards; see "
            "fedjax_pals/experiment/config.py, `configs/*.py`, BUILD_NOTES.md and runs/demo/.")
    assert names_of(text) == {"fedpals_weights", "experiment.shards"}
    assert paths_of(text) == {"fedjax_pals/experiment/config.py", "BUILD_NOTES.md"}
    assert not _resolves("no_such_name") and _resolves("experiment.shards.collect_sweep")


@pytest.mark.parametrize("page", PAGES)
def test_every_name_and_path_a_page_mentions_exists(page):
    text = _text(page)
    missing = sorted(n for n in names_of(text) if n not in NOT_NAMES and not _resolves(n))
    assert not missing, f"{page} names what fedjax_pals does not have: {missing}"
    gone = sorted(p for p in paths_of(text) if not os.path.exists(os.path.join(ROOT, p)))
    assert not gone, f"{page} mentions paths the repository does not hold: {gone}"


def test_the_decisions_index_lists_every_decision_once_with_its_date():
    directory = os.path.join(ROOT, "docs", "decisions")
    index = _text("docs/decisions/index.md")
    pages = sorted(p for p in os.listdir(directory) if re.match(r"\d{4}-.*\.md$", p))
    assert len(pages) >= 90
    for page in pages:
        text = _text(f"docs/decisions/{page}")
        number = page[:4]
        assert text.startswith(f"# {number}. "), f"{page}: its title must start '# {number}. '"
        date = re.search(r"^Date: (\d{4}-\d{2}-\d{2}) · Status: ", text, re.M)
        assert date, f"{page}: no 'Date: YYYY-MM-DD · Status: ...' line"
        rows = [line for line in index.splitlines() if line.startswith(f"| {number} | [")]
        assert len(rows) == 1 and f"]({page}) | {date.group(1)} |" in rows[0], (
            f"index row of {page}: {rows}")
    assert len({p[:4] for p in pages}) == len(pages), "two decisions share a number"


def test_the_readme_is_a_landing_page_with_one_figure():
    # What it is, a figure, the two commands, the entry points, links into the site: the rest
    # lives on the site's pages.
    text = _text("README.md")
    assert len(text.splitlines()) <= 150
    assert len(re.findall(r"!\[[^\]]+\]\(docs/[^)]+\.png\)", text)) == 1


# The API reference: docs/reference.md (the topics) and one page per topic under docs/reference/,
# each public name one `::: fedjax_pals.<name>` entry.
REFERENCE_PAGES = ["docs/reference.md"] + sorted(
    os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "docs", "reference", "*.md")))
ENTRY = re.compile(r"^:::\s*(\S+)", re.M)


def test_the_api_reference_files_every_public_name_once_and_nothing_private():
    import fedjax_pals

    entries = [(page, name) for page in REFERENCE_PAGES for name in ENTRY.findall(_text(page))]
    assert len(entries) >= 100, entries
    whole = [f"{page}: {name}" for page, name in entries if not name.startswith("fedjax_pals.")]
    assert not whole, f"an entry that is not one name of fedjax_pals (a whole module?): {whole}"
    names = [name.split(".", 1)[1] for _, name in entries]
    public = set(fedjax_pals.__all__)
    unfiled = sorted(public - set(names))
    assert not unfiled, (
        f"public names (fedjax_pals.__all__) on no page of the API reference: {unfiled}; file "
        "each as `::: fedjax_pals.<name>` under its topic in docs/reference/")
    twice = sorted({name for name in names if names.count(name) > 1})
    assert not twice, f"names listed on more than one entry of the API reference: {twice}"
    private = sorted({name for name in names if any(p.startswith("_") for p in name.split("."))})
    assert not private, f"private names in the API reference: {private}"
    extra = sorted(set(names) - public)
    assert not extra, f"the API reference lists names that fedjax_pals.__all__ does not: {extra}"
    assert set(REFERENCE_PAGES) <= set(DOC_PAGES), "a reference page is missing from the nav"


def _nav_sections() -> dict[str, int]:
    """Each section of mkdocs.yml's nav, and how many entries it holds directly."""
    with open(os.path.join(ROOT, "mkdocs.yml")) as f:
        nav = f.read().split("\nnav:", 1)[1]
    sections, stack = {}, []  # stack: (indent, title)
    for line in nav.splitlines():
        item = re.match(r"^(\s*)- (.*)$", line)
        if not item:
            continue
        indent, text = len(item.group(1)), item.group(2).strip()
        while stack and stack[-1][0] >= indent:
            stack.pop()
        if stack:
            sections[stack[-1][1]] += 1
        if text.endswith(":"):
            title = text[:-1].strip("\"'")
            sections[title] = 0
            stack.append((indent, title))
    return sections


def test_the_sidebar_groups_the_decisions_and_starts_with_getting_started():
    sections = _nav_sections()
    assert sections["Decisions"] <= 10, sections  # the index and the groups, not 100 pages
    assert max(sections.values()) <= 30, sections
    assert DOC_PAGES[1:3] == ["docs/index.md", "docs/getting_started.md"], DOC_PAGES[:4]
    decisions = [p for p in DOC_PAGES if re.match(r"docs/decisions/\d{4}-", p)]
    assert len(decisions) == len(set(decisions)) >= 90
