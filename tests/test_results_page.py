"""benchmarks/RESULTS.md holds the current claims, one row each, and the README and docs link to its rows
instead of retyping figures: every figure the README quotes is on the page, the page stays short, every row
names its machine type, a commit of this history, a command and an archive entry that exists, and every link
to a row finds it.

    pytest -q tests/test_results_page.py
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "RESULTS.md"
README = REPO / "README.md"
PAGES = [README, *sorted((REPO / "docs").glob("*.md"))]
MAX_LINES = 250
COLUMNS = ["id", "claim", "figure", "machine", "commit", "command", "archive"]
MACHINES = ("Xeon AMX", "EPYC avx512_bf16", "EPYC AVX2", "2-core, type not recorded")
PROGRAMS = {"python", "make", "grpoflow", "pytest"}
NOT_SHIPPED = "not shipped:"  # the figure came from a one-off script: the row says so instead of a command

# A figure: a p-value (`p = 6.4e-10`, `p < 0.001`), a signed number (`+14.8`, `−4.0`: a measured change),
# or a number with a unit: `25.8%`, `1.69×`, `3.8x`, `171 s`, `84 ms`, `12.7 min`, a range `20.2-23.8 min`.
FIGURE = re.compile(
    r"p [=<] \d+(?:\.\d+)?(?:e-\d+)?"
    r"|[+−]\d+(?:\.\d+)?"
    r"|(?<![\w.,+−-])\d+(?:\.\d+)?(?:-\d+(?:\.\d+)?)?(?:%|×|x\b| s\b| ms\b| min\b)"
)
ROW_ID = re.compile(r'^<a id="([a-z0-9-]+)"></a>\1$')
ARCHIVE_LINK = re.compile(r"\]\((archive/[^)#\s]+)(?:#([^)\s]+))?\)")
ROW_LINK = re.compile(r"(?:\]\(|^\[[\w-]+\]: )([^)\s#]*RESULTS\.md)#([\w-]+)", re.M)
REFERENCE = re.compile(r"\[([a-z0-9-]+)\]\[\]")
DEFINITION = re.compile(r"^\[([a-z0-9-]+)\]: ", re.M)


def figures(text: str) -> list[str]:
    """The figures of a text, in order.

    >>> figures("rose from 11.0% to 25.8% (+14.8 points, p = 6.4e-10) in 20.2-23.8 min, 1.69× on 2 cores")
    ['11.0%', '25.8%', '+14.8', 'p = 6.4e-10', '20.2-23.8 min', '1.69×']
    >>> figures("100 steps × 8 on 1- and 2-step problems, Python >= 3.11, 2026-12-06, 9be36e2")
    []
    """
    return FIGURE.findall(text)


def quoted(figure: str, text: str) -> bool:
    """The figure stands in the text as a whole number, not as part of a longer one.

    >>> quoted("+4.4", "+4.45 and +14.4"), quoted("+4.4", "(+4.4, p = 1)"), quoted("12.7 min", "= 12.7 min |")
    (False, True, True)
    """
    return re.search(rf"(?<![\d.]){re.escape(figure)}(?!\d)", text) is not None


def slug(heading: str) -> str:
    """GitHub's anchor of a markdown heading.

    >>> slug("Issue 41: `make demo` on a fresh clone of f62fb56")
    'issue-41-make-demo-on-a-fresh-clone-of-f62fb56'
    """
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """The heading anchors of a markdown file (fenced blocks skipped) and its `<a id>` anchors."""
    found, inside = set(), False
    for line in path.read_text().splitlines():
        if line.startswith("```"):
            inside = not inside
        elif not inside and re.match(r"#{1,6} ", line):
            found.add(slug(line.lstrip("#")))
    return found | set(re.findall(r'<a id="([^"]+)"></a>', path.read_text()))


def cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split(" | ")]


def rows() -> list[list[str]]:
    """The claim rows of every table on the page, each checked to sit under the page's column header."""
    out, header = [], None
    for line in RESULTS.read_text().splitlines():
        if not line.startswith("|"):
            header = None
        elif header is None:
            header = cells(line)
        elif not set(line) <= set("|-: "):
            assert header == COLUMNS, f"a table on RESULTS.md has columns {header}, not {COLUMNS}"
            out.append(cells(line))
    return out


ROWS = rows()


def test_the_page_is_short_and_its_rows_have_stable_ids():
    assert len(RESULTS.read_text().splitlines()) <= MAX_LINES
    assert len(ROWS) >= 20
    assert all(len(row) == len(COLUMNS) for row in ROWS), [row[0] for row in ROWS if len(row) != len(COLUMNS)]
    ids = [ROW_ID.match(row[0]) for row in ROWS]
    assert all(ids), [row[0] for row, m in zip(ROWS, ids, strict=True) if not m]
    assert len({m.group(1) for m in ids}) == len(ROWS)


@pytest.mark.parametrize("row", ROWS, ids=[row[0].rsplit(">", 1)[-1] for row in ROWS])
def test_every_row_has_a_figure_a_machine_a_command_and_an_archive_entry(row):
    record = dict(zip(COLUMNS, row, strict=True))
    assert re.search(r"\d", record["figure"]), "the figure cell holds no number"
    assert record["machine"].startswith(MACHINES), record["machine"]
    assert re.fullmatch(r"[0-9a-f]{7,40}(, [0-9a-f]{7,40})*", record["commit"]), record["commit"]

    command = record["command"]
    spans = re.findall(r"`([^`]+)`", command)
    assert command.startswith(NOT_SHIPPED) or spans, "no command"
    if not command.startswith(NOT_SHIPPED):
        argv = [a for a in spans[0].split() if not re.match(r"^[A-Z_]+=", a)]
        if argv[0] == "taskset":
            argv = argv[3:]  # taskset -c N PROGRAM ...
        assert argv[0] in PROGRAMS or (REPO / argv[0]).is_file(), spans[0]
        for path in re.findall(r"\b((?:benchmarks|tests|components)/[\w./-]+\.py)\b", " ".join(spans)):
            assert (REPO / path).is_file(), path

    links = ARCHIVE_LINK.findall(record["archive"])
    assert links, "no archive link"
    for target, anchor in links:
        path = RESULTS.parent / target
        assert path.is_file(), target
        assert not anchor or anchor in anchors(path), f"{target}#{anchor}"


def test_every_commit_a_row_names_is_in_this_history():
    git = {"cwd": REPO, "capture_output": True, "text": True}
    probe = subprocess.run(["git", "rev-parse", "--is-shallow-repository"], **git)
    if probe.returncode != 0 or probe.stdout.strip() != "false":
        pytest.skip("not a full git checkout")
    named = sorted({c for row in ROWS for c in row[COLUMNS.index("commit")].split(", ")})
    missing = [c for c in named
               if subprocess.run(["git", "cat-file", "-e", c + "^{commit}"], **git).returncode]
    assert missing == []


def test_every_figure_the_readme_quotes_is_on_the_results_page():
    """The README links rows rather than retyping what only it says: a figure there is on RESULTS.md too."""
    readme = " ".join(README.read_text().split())
    results = " ".join(RESULTS.read_text().split())
    found = figures(readme)
    assert len(found) >= 10
    assert [f for f in found if not quoted(f, results)] == []


def test_links_to_rows_find_them():
    """Inline links (`[id](../benchmarks/RESULTS.md#id)`) and reference links (`[id][]` beside
    `[id]: ../benchmarks/RESULTS.md#id`) from the README and the docs reach a row; every reference is
    defined."""
    ids = anchors(RESULTS)
    links = [(page, path, anchor) for page in PAGES for path, anchor in ROW_LINK.findall(page.read_text())]
    assert len(links) >= 20
    lost = [(page.name, f"{path}#{anchor}") for page, path, anchor in links
            if (page.parent / path).resolve() != RESULTS.resolve() or anchor not in ids]
    assert lost == []
    texts = {page.name: page.read_text() for page in PAGES}
    undefined = [(name, label) for name, text in texts.items()
                 for label in set(REFERENCE.findall(text)) - set(DEFINITION.findall(text))]
    assert undefined == []
