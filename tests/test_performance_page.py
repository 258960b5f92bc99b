"""docs/performance.md is a reader's page; everything else moved to docs/notes/performance-history.md.

The pages are rendered in-process from ``benchmarks/results/*.json`` by
``benchmarks/make_tables.py`` (no mkdocs build: that is tests/test_docs_site.py): the reader's
page stays short (at most 250 lines, none over 300 characters), answers its questions in order
with one table each followed by the command that measured it (or says that no product figure
exists yet), shows only product figures (records whose command is one ``ctxkit`` command), the
newest per case and peer, and every other record is on the history page, with the
hand-written notes.
"""

import importlib.util
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
QUESTIONS = ["## How fast is fine-tuning?", "## How fast is pretraining?", "## How fast is inference on a GPU?",
             "## How fast is inference on a CPU?", "## How fast is decoding?", "## Other models"]


@pytest.fixture(scope="module")
def tables():
    """benchmarks/make_tables.py as a module (a script beside its helpers, as docs/hooks.py loads it)."""
    spec = importlib.util.spec_from_file_location("ctxkit_test_make_tables", REPO / "benchmarks" / "make_tables.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def page(tables):
    return tables.performance_page()


def _reader_tables(tables):
    return [table for _, _, section in tables.READER_SECTIONS for table in section]


def test_the_page_is_short(page):
    lines = page.splitlines()
    assert len(lines) <= 250, f"docs/performance.md has {len(lines)} lines"
    long = [(i + 1, len(line)) for i, line in enumerate(lines) if len(line) > 300]
    assert not long, f"lines over 300 characters (line, length): {long}"


def test_questions_in_order_each_table_followed_by_its_command(tables, page):
    lines = page.splitlines()
    assert "Speed is benchmarked here, never asserted in tests." in page
    positions = [lines.index(q) for q in QUESTIONS if q in lines]
    assert positions == sorted(positions) and len(positions) >= len(QUESTIONS) - 1  # "Other models" only with figures
    assert "notes/performance-history.md" in lines[-1]
    # each section: one table (the sub-sections ### add at most one more), then "Command..."
    tables_seen = 0
    for i, line in enumerate(lines):
        if line.startswith("|") and (i + 1 == len(lines) or not lines[i + 1].startswith("|")):
            tables_seen += 1
            following = next(ln for ln in lines[i + 1:] if ln.strip())
            assert following.startswith("Command"), f"the table ending at line {i + 1} is followed by {following!r}"
    answered = [q for q in QUESTIONS if q in lines]
    assert tables_seen + page.count(tables.NOT_YET) >= len(answered) - 1  # "Other models" holds sub-sections
    sections = "\n".join(lines).split("\n## ")[1:]
    for section in sections:
        for part in section.split("\n### "):
            separators = [ln for ln in part.splitlines() if ln.startswith("|---")]
            assert len(separators) <= 1, f"more than one table in {part.splitlines()[0]!r}"


def test_only_the_newest_record_per_case_and_peer(tables, page):
    lines = page.splitlines()
    for table in _reader_tables(tables):
        kept = [r for r in tables._load(table.name) if table.keep(r) and tables.is_product(r)]
        shown = table.records()
        assert all(r["command"].startswith("ctxkit ") for r in shown), table.name
        assert len({table.key(r) for r in shown}) == len(shown)
        for r in shown:
            same = [x for x in kept if table.key(x) == table.key(r)]
            latest = max(x["date"] for x in same)
            # the newest date, and of that date the last record in file order
            assert r == [x for x in same if x["date"] == latest][-1], (table.name, r["case"])
            row = "| " + " | ".join(tables.reader_cells(table, r)) + " |"
            assert any(line.startswith(row) for line in lines), f"{table.name}: no row {row}"
            assert f"`{r['command']}`" in page, f"{table.name}: the command of {r['case']!r} is not named"


def _renderings(v) -> set:
    """The ways the history tables print a value (each table keeps its older format)."""
    if not isinstance(v, (int, float)):
        return {str(v)}
    return {f"{v:.2f}", f"{v:.3f}", f"{v:,.0f}", f"{v:,.1f}", f"{v:,.4g}", f"{v:.4g}", str(v)}


def test_every_other_record_is_on_the_history_page(tables):
    history = tables.history_page().splitlines()
    rows = [line for line in history if line.startswith("|")]
    for table in _reader_tables(tables):
        shown = table.records()
        for r in tables._load(table.name):
            if "benchmark" not in r or r in shown:
                continue  # quality records belong to results.md
            cells = [row for row in rows if f"| {r['date']} |" in row]
            assert any(f"| {text}" in row for row in cells for text in _renderings(r["ctxkit"])), \
                f"{table.name}: {r['case']!r} ({r['ctxkit']}, {r['date']}) is on neither page"


def test_committed_pages_are_the_generated_ones(tables, page):
    performance = (REPO / "docs" / "performance.md").read_text(encoding="utf-8")
    assert performance == page, "docs/performance.md is stale: run python benchmarks/make_tables.py"
    committed = (REPO / "docs" / "notes" / "performance-history.md").read_text(encoding="utf-8")
    assert tables.NOTES_HEADING in committed and tables.NOTES_HEADING not in performance
    assert tables.with_kept_notes(tables.history_page(), committed) == committed, \
        "docs/notes/performance-history.md is stale: run python benchmarks/make_tables.py"
