"""CHANGELOG.md keeps the form its preamble states: Keep a Changelog 1.1.0, with this project's
order of sections (Deprecated first), a dated heading per version and deprecations that name the
version refusing them. `problems` checks a text, so the tests run it on the real file and on small
texts broken on purpose."""

from __future__ import annotations

import datetime
import os
import re
import tomllib

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The sections a version may have, in the order they must come (Keep a Changelog's, but for
# Deprecated, which this project lists first: what will stop working is what a user acts on).
SECTIONS = ("Deprecated", "Added", "Changed", "Removed", "Fixed", "Security")
UNRELEASED = "## [Unreleased]"
VERSION = re.compile(r"^## \[(\d+)\.(\d+)\.(\d+)\] - (\d{4}-\d{2}-\d{2})$")
SECTION = re.compile(r"^### (.*)$")
# A link reference definition ("[0.2.0]: https://..."): the repository has no public address.
LINK_DEFINITION = re.compile(r"^ {0,3}\[[^\]]+\]:")
# A deprecation names the version that refuses what warns ("0.3.0 refuses it").
REFUSED_IN = re.compile(r"\b(\d+)\.(\d+)\.(\d+) refuses\b")


def _entries(lines: list[str]) -> tuple[list[str], list[str]]:
    """A section's body as its entries (a bullet with its indented continuation lines, joined
    into one line), and the lines that are neither."""
    entries, stray = [], []
    for line in lines:
        if line.startswith("- "):
            entries.append(line[2:].strip())
        elif line.startswith("  ") and line.strip() and entries:
            entries[-1] += " " + line.strip()
        elif line.strip():
            stray.append(line)
    return entries, stray


def parse(text: str) -> tuple[list[str], list[tuple[str, list[tuple[str, list[str]]]]]]:
    """The preamble's lines, then each version heading with its sections, each a heading and
    the lines under it; lines of a version before its first section go in a section named ''."""
    preamble: list[str] = []
    versions: list[tuple[str, list[tuple[str, list[str]]]]] = []
    for line in text.splitlines():
        if line.startswith("## "):
            versions.append((line, []))
        elif not versions:
            preamble.append(line)
        elif line.startswith("### "):
            versions[-1][1].append((line, []))
        else:
            if not versions[-1][1]:
                versions[-1][1].append(("", []))
            versions[-1][1][-1][1].append(line)
    return preamble, versions


def problems(text: str, released: str | None = None) -> list[str]:
    """What keeps `text` from the form (empty when it has it). `released`: pyproject.toml's
    version, which must be the newest dated version's."""
    found: list[str] = []
    lines = text.splitlines()
    if not lines or lines[0] != "# Changelog":
        found.append("the first line is not '# Changelog'")
    for i, line in enumerate(lines, 1):
        if LINK_DEFINITION.match(line):
            found.append(f"line {i} defines a link ({line!r}): there is no public address")
        if re.match(r"^#(#{3,})? ", line) and i != 1:
            found.append(f"line {i}: a heading of another level ({line!r})")
    preamble, versions = parse(text)
    if not any(line.strip() for line in preamble[1:]):
        found.append("no preamble")
    if not versions or versions[0][0] != UNRELEASED:
        found.append(f"the first version heading is not {UNRELEASED!r}")
    newest: tuple[int, int, int] | None = None
    previous: tuple[tuple[int, int, int], datetime.date] | None = None
    for position, (heading, sections) in enumerate(versions):
        if heading == UNRELEASED:
            if position:
                found.append(f"{UNRELEASED!r} is not the first version")
            version = None
        else:
            match = VERSION.match(heading)
            if not match:
                found.append(f"{heading!r} is not '## [X.Y.Z] - YYYY-MM-DD'")
                continue
            version = tuple(int(g) for g in match.group(1, 2, 3))
            try:
                date = datetime.date.fromisoformat(match.group(4))
            except ValueError:
                found.append(f"{heading!r}: {match.group(4)} is not a date")
                continue
            if previous is not None and not version < previous[0]:
                found.append(f"{heading!r} is not older than the version above it")
            if previous is not None and date > previous[1]:
                found.append(f"{heading!r} is dated after the version above it")
            previous = (version, date)
            newest = newest or version
        order = -1
        for section, body in sections:
            entries, stray = _entries(body)
            if section == "":
                if entries or stray:
                    found.append(f"{heading!r}: text before its first section")
                continue
            name = SECTION.match(section).group(1)
            if name not in SECTIONS:
                found.append(f"{heading!r}: {section!r} is not one of {SECTIONS}")
                continue
            if SECTIONS.index(name) <= order:
                found.append(f"{heading!r}: {section!r} out of order (the order is "
                             f"{', '.join(SECTIONS)})")
            order = max(order, SECTIONS.index(name))
            if not entries:
                found.append(f"{heading!r}: {section!r} is empty")
            for line in stray:
                found.append(f"{heading!r}, {section!r}: {line!r} is not part of an entry")
            if name == "Deprecated":
                found += _deprecation_problems(heading, version, entries)
    # Deprecations under Unreleased must outlive the newest release too.
    for heading, sections in versions[:1]:
        if heading == UNRELEASED and newest is not None:
            for section, body in sections:
                if section == "### Deprecated":
                    found += _deprecation_problems(heading, newest, _entries(body)[0])
    if released is not None:
        newest_text = ".".join(map(str, newest)) if newest else None
        if newest_text != released:
            found.append(f"the newest dated version is {newest_text}, pyproject.toml's {released}"
                         " (Unreleased holds changes on top of the released version)")
    return found


def _deprecation_problems(heading: str, version: tuple[int, int, int] | None,
                          entries: list[str]) -> list[str]:
    found = []
    for entry in entries:
        start = entry[:60]
        refused = [tuple(int(g) for g in m.groups()) for m in REFUSED_IN.finditer(entry)]
        if not refused:
            found.append(f"{heading!r}: the deprecation {start!r}... names no 'X.Y.Z refuses'")
        elif version is not None and not all(r > version for r in refused):
            found.append(f"{heading!r}: the deprecation {start!r}... is refused in a version "
                         "not after its own")
        if not re.search(r"\bwarn", entry):
            found.append(f"{heading!r}: the deprecation {start!r}... does not say what warns")
        if "Fix:" not in entry:
            found.append(f"{heading!r}: the deprecation {start!r}... names no 'Fix:'")
    return found


def _changelog() -> str:
    with open(os.path.join(ROOT, "CHANGELOG.md")) as f:
        return f.read()


def _released() -> str:
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        return tomllib.load(f)["project"]["version"]


def test_the_changelog_is_in_keep_a_changelog_form_with_deprecations_first():
    assert problems(_changelog(), _released()) == []


def test_the_changelog_dates_and_counts_what_it_says():
    _, versions = parse(_changelog())
    headings = [heading for heading, _ in versions]
    assert headings[0] == UNRELEASED
    assert f"## [{_released()}] - " in headings[1]
    # Every entry sits in a section: none is lost between versions.
    entries = sum(len(_entries(body)[0]) for _, sections in versions for _, body in sections)
    assert entries == _changelog().count("\n- ")


GOOD = """# Changelog

What changed.

## [Unreleased]

### Deprecated
- **Old form** warns; 0.4.0 refuses it. Fix: the new
  form.

### Added
- A thing.

## [0.2.0] - 2026-11-28

### Deprecated
- A name that warns; 0.3.0
  refuses it. Fix: another name.

### Added
- More.

### Fixed
- A bug.

## [0.1.0] - 2026-11-27

### Added
- The first release.
"""


def _swap_sections(text: str, version: str, first: str, second: str) -> str:
    """`text` with `version`'s sections `first` and `second` exchanged, bodies and all."""
    blocks = re.split(r"(?m)^(?=##)", text)
    start = next(k for k, b in enumerate(blocks) if b.startswith(version + "\n")
                 or b.startswith(version + " "))
    end = next((k for k in range(start + 1, len(blocks)) if blocks[k].startswith("## ")),
               len(blocks))
    names = [b.split("\n")[0] for b in blocks]
    i = next(k for k in range(start, end) if names[k] == first)
    j = next(k for k in range(start, end) if names[k] == second)
    a, b = blocks[i], blocks[j]
    # Keep the blank line that ends a block before the next heading where it was.
    blocks[i], blocks[j] = b.rstrip("\n") + "\n\n", a.rstrip("\n") + "\n\n"
    return "".join(blocks).rstrip("\n") + "\n"


BROKEN = {
    "no Unreleased": (lambda t: t.replace("## [Unreleased]\n\n### Deprecated\n- **Old form** "
                                          "warns; 0.4.0 refuses it. Fix: the new\n  form.\n\n"
                                          "### Added\n- A thing.\n\n", ""),
                      "is not '## [Unreleased]'"),
    "Unreleased not first": (lambda t: t.replace("## [Unreleased]", "## [0.3.0] - 2026-12-01", 1)
                             .replace("## [0.1.0] - 2026-11-27", "## [Unreleased]"),
                             "is not the first version"),
    "no date": (lambda t: t.replace("## [0.2.0] - 2026-11-28", "## [0.2.0]"),
                "is not '## [X.Y.Z] - YYYY-MM-DD'"),
    "the old heading": (lambda t: t.replace("## [0.2.0] - 2026-11-28", "## 0.2.0"),
                        "is not '## [X.Y.Z] - YYYY-MM-DD'"),
    "a bad date": (lambda t: t.replace("2026-11-28", "2026-02-30"), "is not a date"),
    "versions out of order": (lambda t: t.replace("[0.1.0]", "[0.3.0]"), "is not older"),
    "dates out of order": (lambda t: t.replace("2026-11-27", "2026-11-29"), "is dated after"),
    "Added before Deprecated": (lambda t: _swap_sections(t, "## [0.2.0]", "### Deprecated",
                                                         "### Added"), "out of order"),
    "Fixed before Added": (lambda t: _swap_sections(t, "## [0.2.0]", "### Added", "### Fixed"),
                           "out of order"),
    "a topic as a section": (lambda t: t.replace("### Fixed", "### Privacy"), "is not one of"),
    "an empty section": (lambda t: t.replace("### Fixed\n- A bug.\n", "### Fixed\n"),
                         "is empty"),
    "a section twice": (lambda t: t.replace("### Fixed", "### Added"), "out of order"),
    "an inline deprecation left behind": (lambda t: t.replace(
        "- A bug.", "- A bug.\n*Deprecated:* a form warns."), "is not part of an entry"),
    "a deprecation without its version": (lambda t: t.replace("0.3.0\n  refuses it", "later"),
                                          "names no 'X.Y.Z refuses'"),
    "a deprecation refused by its own version": (lambda t: t.replace("0.3.0\n", "0.2.0\n"),
                                                 "not after its own"),
    "Unreleased refusing in a released version": (lambda t: t.replace("0.4.0", "0.2.0"),
                                                  "not after its own"),
    "a deprecation without a fix": (lambda t: t.replace("Fix: another name.", ""),
                                    "names no 'Fix:'"),
    "a deprecation not saying what warns": (lambda t: t.replace("A name that warns", "A name"),
                                            "does not say what warns"),
    "a compare link": (lambda t: t + "\n[0.2.0]: https://example.org/compare/v0.1.0...v0.2.0\n",
                       "defines a link"),
    "a deeper heading": (lambda t: t.replace("- More.", "#### More\n- More."),
                         "a heading of another level"),
    "text before a section": (lambda t: t.replace("## [0.1.0] - 2026-11-27\n",
                                                  "## [0.1.0] - 2026-11-27\nSome words.\n"),
                              "text before its first section"),
}


def test_the_small_good_text_has_the_form():
    assert problems(GOOD, "0.2.0") == []


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_a_text_broken_on_purpose_is_refused(case):
    breaking, expected = BROKEN[case]
    broken = breaking(GOOD)
    assert broken != GOOD, case
    assert any(expected in p for p in problems(broken, "0.2.0")), problems(broken, "0.2.0")


def test_a_released_version_newer_than_the_changelog_s_is_refused():
    assert any("pyproject.toml's 0.3.0" in p for p in problems(GOOD, "0.3.0"))


@pytest.mark.parametrize("version, first, second", [
    ("## [Unreleased]", "### Deprecated", "### Added"),
    ("## [0.2.0]", "### Deprecated", "### Fixed"),
    ("## [0.2.0]", "### Added", "### Changed"),
])
def test_the_real_changelog_with_two_sections_swapped_is_refused(version, first, second):
    swapped = _swap_sections(_changelog(), version, first, second)
    assert swapped != _changelog()
    assert any("out of order" in p for p in problems(swapped, _released()))
