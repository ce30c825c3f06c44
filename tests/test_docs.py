"""The documents hold together: README.md stays a short first page, and every relative link
in README.md, ARCHITECTURE.md and docs/*.md reaches a file, and a heading for `#anchor`.

Anchors are the slugs GitHub gives headings: lower case, punctuation but `-` and `_`
dropped, spaces turned into `-`, a repeated slug numbered `-1`, `-2`, ... Links inside
code (fenced or indented blocks, `backticks`) are not links and are not checked."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from readme_examples import README, TOP, documents, name

README_MOST_LINES = 199  # under 200: the rest belongs to docs/ and ARCHITECTURE.md

_LINK = re.compile(r"(?<![!\\])\[((?:[^\]\\]|\\.)*)\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
_OPENING = re.compile(r" {0,3}(`{3,}|~{3,})")
_CLOSING = re.compile(r" {0,3}(`{3,}|~{3,})\s*")
_CODE_SPAN = re.compile(r"(`+)(?!`)(?:(?!\n[ \t]*\n).)*?(?<!`)\1(?!`)", re.DOTALL)
_HEADING = re.compile(r" {0,3}(#{1,6})\s+(.*?)(?:\s+#+)?\s*")


def prose(text: str) -> str:
    """A Markdown text without its code: fenced and indented blocks become empty lines and
    code spans vanish, newlines kept, so that line numbers hold."""
    out: list[str] = []
    fence: str | None = None
    indented = False
    before = ""  # the line before, as written
    for line in text.split("\n"):
        blank = not line.strip()
        opening = _OPENING.match(line)
        closing = _CLOSING.fullmatch(line)
        if fence is not None:
            out.append("")
            if closing and closing.group(1)[0] == fence[0] and len(closing.group(1)) >= len(fence):
                fence = None
        elif opening:
            fence = opening.group(1)
            out.append("")
        elif line.startswith("    ") and (indented or not before.strip() or before.startswith(("#", "<!--"))):
            indented = True  # an indented block, as tests/readme_examples.py finds them
            out.append("")
        else:
            indented = indented and blank
            out.append(line)
        before = line
    return _CODE_SPAN.sub(lambda m: "\n" * m.group(0).count("\n"), "\n".join(out))


def slug(heading: str) -> str:
    text = heading.strip().lower().replace("`", "")
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(document: Path) -> set[str]:
    found: set[str] = set()
    seen: dict[str, int] = {}
    for line in prose(document.read_text()).split("\n"):
        heading = _HEADING.fullmatch(line)
        if heading:
            base = slug(heading.group(2))
            count = seen.get(base, 0)
            seen[base] = count + 1
            found.add(base if count == 0 else f"{base}-{count}")
    return found


def links(document: Path) -> list[tuple[int, str]]:
    """(line, target) for every Markdown link in the document's prose."""
    text = prose(document.read_text())
    return [(text.count("\n", 0, m.start()) + 1, m.group(2)) for m in _LINK.finditer(text)]


def broken(document: Path, top: Path = TOP) -> list[str]:
    problems = []
    for line, target in links(document):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:, ...
            continue
        path, _, anchor = target.partition("#")
        file = (document.parent / path).resolve() if path else document
        where = f"{document.relative_to(top).as_posix()}:{line} ({target})"
        if not file.is_relative_to(top.resolve()):
            problems.append(f"{where}: points outside the checkout")
        elif not file.exists():
            problems.append(f"{where}: no such file")
        elif anchor and file.suffix == ".md" and anchor not in anchors(file):
            problems.append(f"{where}: {file.relative_to(top.resolve()).as_posix()} has no heading #{anchor}")
    return problems


@pytest.mark.parametrize("document", documents(), ids=name)
def test_every_relative_link_reaches_a_file_and_a_heading(document: Path) -> None:
    problems = broken(document)
    assert not problems, "\n".join(problems)


def test_the_readme_stays_a_short_first_page() -> None:
    lines = README.read_text().count("\n")
    assert lines <= README_MOST_LINES, (
        f"README.md has {lines} lines, past {README_MOST_LINES}: move the detail to a page of "
        "docs/ (or to ARCHITECTURE.md) and link it from the README's table"
    )


def test_the_readme_links_every_page_of_docs() -> None:
    targets = {target.partition("#")[0] for _, target in links(README)}
    pages = {name(page) for page in documents() if page.parent.name == "docs"}
    assert pages <= targets, f"pages of docs/ the README does not link: {sorted(pages - targets)}"


# ---------------------------------------------------------------- the helpers themselves


def test_slugs_are_github_s() -> None:
    assert slug("Many queues: `curb router`") == "many-queues-curb-router"
    assert slug("The HTTP API (Narconi's)") == "the-http-api-narconis"
    assert slug("Delays, retries and dead letters") == "delays-retries-and-dead-letters"
    assert slug("The STOMP 1.2 subset") == "the-stomp-12-subset"


def test_a_broken_link_is_named_with_its_line(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("# A\n\n## Two words\n\n## Two words\n")
    page = tmp_path / "README.md"
    page.write_text(
        "# Top\n"
        "[ok](docs/a.md#two-words) [also](docs/a.md#two-words-1) [self](#top) [web](https://example.com)\n"
        "[gone](docs/b.md) [no heading](docs/a.md#three) [a\n"
        "line apart](docs/c.md)\n"
        "`[code](nowhere.md)`\n"
        "\n"
        "    [indented](nowhere.md)\n"
        "```\n"
        "[fenced](nowhere.md)\n"
        "```\n"
    )
    assert broken(page, tmp_path) == [
        "README.md:3 (docs/b.md): no such file",
        "README.md:3 (docs/a.md#three): docs/a.md has no heading #three",
        "README.md:3 (docs/c.md): no such file",
    ]


def test_ci_runs_exactly_the_commands_the_readme_gives():
    """Every command of .ci/run (its lines that are not comments, `set` or `cd`) stands,
    as written, at the start of a line of README.md's indented commands: CI checks what a
    user is told to run, no more."""
    ci = (TOP / ".ci" / "run").read_text().splitlines()
    commands = [line.strip() for line in ci if line.strip() and not line.lstrip().startswith(("#", "set ", "cd "))]
    shown = [line.strip() for line in README.read_text().splitlines() if line.startswith("    ")]
    missing = [c for c in commands if not any(line.split("  #")[0].strip() == c for line in shown)]
    assert commands and not missing, f"commands CI runs that README.md does not give: {missing}"
