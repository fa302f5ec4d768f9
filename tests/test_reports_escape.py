"""Stored strings (back-end names, config names, paths, error messages) are shown as written:
no Markdown or HTML they contain takes effect in summary.md or report.html."""
from __future__ import annotations

import json
import re
import shutil
from html.parser import HTMLParser
from pathlib import Path

import pytest

from planted import cell
from fusedce_profiler.instrument import store
from fusedce_profiler.instrument.snapshot import parse_timeline
from fusedce_profiler.judgements.doctor.doctor import Check, DoctorRun
from fusedce_reports import build_report
from fusedce_reports.doctor_report import write_doctor_report
from fusedce_reports.escape import Markdown, code_block, link_target, markdown_text, plot_text
from fusedce_reports.markdown import markdown_table
from fusedce_reports.parity_report import write_parity_report
from test_profiler_snapshot import synthesise_snapshot

EVIL = "evil:<img src=x onerror=alert(1)>|*x*"
USER = "evil_losses.cce:loss"
"""A user's back-end: a stored name is a back-end name or ``module:callable``, nothing else."""
SCRIPT = "RuntimeError: <script>alert(1)</script> | `rm -rf` [link](http://x) #1"
FIXTURES = Path(__file__).parent / "fixtures"


# --- the escaper ------------------------------------------------------------------------------

@pytest.mark.parametrize("raw, escaped", [
    ("fusedce", "fusedce"),
    ("pkg.mod:my_loss", "pkg.mod:my_loss"),  # an underscore inside a word starts nothing
    ("_private", "\\_private"),
    ("a*b*c", "a\\*b\\*c"),
    ("<img src=x>", "&lt;img src=x&gt;"),
    ("a|b", "a\\|b"),
    ("`code`", "\\`code\\`"),
    ("[x](y)", "\\[x\\](y)"),
    ("$x$ ~y~ #3", "\\$x\\$ \\~y\\~ \\#3"),
    ("AT&amp;T", "AT&amp;amp;T"),
    ("back\\slash", "back\\\\slash"),
    ("line one\nline two", "line one line two"),
    ("- not a list", "\\- not a list"),
    ("1. not a list", "1\\. not a list"),
])
def test_markdown_text_escapes_what_markdown_would_interpret(raw, escaped):
    assert markdown_text(raw) == escaped


def test_markdown_text_leaves_line_starts_alone_in_table_cells_and_passes_markdown_through():
    assert markdown_text("-5.00 MiB", line_start=False) == "-5.00 MiB"
    assert markdown_text(Markdown("**bold** `code`")) == "**bold** `code`"


def test_a_table_keeps_its_columns_whatever_its_cells_hold():
    import pandas as pd

    table = markdown_table(pd.DataFrame({"back-end": [EVIL], "status": [SCRIPT]}))
    for line in table.splitlines():
        assert len(re.findall(r"(?<!\\)\|", line)) == 3, line


def test_code_block_fence_is_longer_than_any_backtick_run_inside():
    block = code_block(["a ``` b", "````"])
    assert block[0] == "`````text" and block[-1] == "`````"


def test_link_target_and_plot_text():
    assert link_target("plots/timeline_my run (1).png") == "plots/timeline_my%20run%20%281%29.png"
    assert plot_text("a$b$") == r"a\$b\$"
    # matplotlib prints a glyph it lacks to the terminal: a control character is drawn spelled out
    assert plot_text("\x1b]0;PWN\x07\x0eLBL") == r"\x1b]0;PWN\x07\x0eLBL"


# --- whole reports ----------------------------------------------------------------------------

def _outside_code(markdown: str) -> str:
    """The Markdown with fenced blocks removed (shown verbatim, they are not interpreted)."""
    out, fence = [], None
    for line in markdown.splitlines():
        mark = re.match(r"^(`{3,})", line)
        if fence is None and mark:
            fence = mark.group(1)
        elif fence is not None and line.startswith(fence) and line.strip("`") == "":
            fence = None
        elif fence is None:
            out.append(line)
    return "\n".join(out)


def _unescaped_pipes(line: str) -> int:
    return len(re.findall(r"(?<!\\)\|", line))


class _Tags(HTMLParser):
    def __init__(self):
        super().__init__()
        self.tags: list[tuple[str, dict]] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))


@pytest.fixture(scope="module")
def evil_report(tmp_path_factory):
    run = tmp_path_factory.mktemp("evil")
    timeline = run / store.SNAPSHOTS_DIR / "evil (1)[x].timeline.json"
    store.write_json(timeline, parse_timeline(synthesise_snapshot()).to_dict())
    rows = [cell("torch", 1024, 100, time_ms=3.0), cell(USER, 1024, 10, time_ms=1.0),
            cell(USER, 2048, None, status="error", message=SCRIPT), cell("torch", 2048, 200, time_ms=6.0),
            cell(EVIL, 4096, 10)]  # a name no back-end has: the row is skipped, and the note quotes it
    rows[1].timeline_path = f"snapshots/{timeline.name}"
    (run / store.RESULTS_FILE).write_text("".join(store.dumps(r.to_dict()) + "\n" for r in rows))
    store.write_json(run / store.ENVIRONMENT_FILE, {"torch": "2.13", "backends": {"liger": f"1.0 ``` {EVIL}"}})
    return build_report(run)


def test_summary_md_shows_the_names_and_messages_as_text(evil_report):
    summary = evil_report.summary.read_text()
    prose = _outside_code(summary)
    assert "<img" not in prose and "<script" not in prose
    for markup in (r"`rm", r"\[link", r"\*x"):  # only in their escaped forms
        assert not re.search(r"(?<!\\)" + markup, prose), markup
    assert "evil:&lt;img src=x onerror=alert(1)&gt;\\|\\*x\\*" in prose
    assert "&lt;script&gt;" in prose
    # the environment block still holds the value verbatim and its fence is not closed early
    assert "````text" in summary and f"backends.liger: 1.0 ``` {EVIL}" in summary


def test_summary_md_tables_keep_their_column_count(evil_report):
    prose = _outside_code(evil_report.summary.read_text())
    tables = [block for block in prose.split("\n\n") if block.startswith("| back-end")]
    assert tables
    for table in tables:
        lines = table.splitlines()
        assert {_unescaped_pipes(line) for line in lines} == {_unescaped_pipes(lines[0])}, table


def test_summary_md_links_the_timeline_through_an_encoded_target(evil_report):
    (timeline,) = evil_report.timelines
    summary = evil_report.summary.read_text()
    assert "](plots/timeline_evil%20%281%29%5Bx%5D.png)" in summary
    assert timeline.name == "timeline_evil (1)[x].png"


def test_report_html_has_no_tag_the_stored_strings_brought(evil_report):
    page = evil_report.html.read_text()
    assert "<script" not in page and "<img src=x" not in page
    parser = _Tags()
    parser.feed(page)
    images = [attrs for tag, attrs in parser.tags if tag == "img"]
    assert images and all(set(attrs) == {"alt", "src"} and attrs["src"].startswith("data:image/png;base64,")
                          for attrs in images)
    assert any(attrs["alt"].startswith(f"Memory timeline: {USER}") for attrs in images)  # the alt holds it as text
    assert {tag for tag, _ in parser.tags} <= {"html", "head", "meta", "title", "style", "body", "h1", "h2", "h3",
                                               "p", "ul", "li", "b", "code", "table", "thead", "tbody", "tr", "th",
                                               "td", "figure", "figcaption", "img", "details", "summary", "pre"}


def test_report_html_rows_keep_their_cell_count(evil_report):
    page = evil_report.html.read_text()
    for table in re.findall(r"<table>.*?</table>", page, flags=re.S):
        heads = table.count("<th>")
        for row in re.findall(r"<tbody>.*?</tbody>", table, flags=re.S)[0].split("</tr>")[:-1]:
            assert row.count("<td") == heads


def test_parity_report_escapes_back_end_and_config_names(tmp_path):
    run = tmp_path / "parity"
    shutil.copytree(FIXTURES / "h200_parity", run)
    raw = json.loads((run / "parity.json").read_text())
    raw["settings"]["config"]["name"] = "<b>cfg</b>"
    text = json.dumps(raw).replace('"fusedce"', json.dumps(EVIL))
    (run / "parity.json").write_text(text)
    summary, _ = write_parity_report(run)
    prose = _outside_code(summary.read_text())
    assert "<img" not in prose and "<b>" not in prose
    assert f"**{markdown_text(EVIL)} vs torch: at most" in prose
    table = [line for line in prose.splitlines() if line.startswith("| ")]
    assert {_unescaped_pipes(line) for line in table} == {8}


def test_doctor_report_escapes_the_wrapper_name_and_the_evidence(tmp_path):
    run = DoctorRun(EVIL, "tiny", [Check("the wrapper runs", "fail", f"calling it raised {SCRIPT}")])
    store.write_json(tmp_path / store.DOCTOR_FILE, run.to_dict())
    prose = write_doctor_report(tmp_path).read_text()
    assert "<img" not in prose and "<script" not in prose
    assert markdown_text(EVIL) in prose
    table = [line for line in prose.splitlines() if line.startswith("| ")]
    assert {_unescaped_pipes(line) for line in table} == {4}


HOSTILE_ENVIRONMENT = {"gpu": "H200\n```\n</details>\n<script>alert(1)</script>\n# Verdict: PASS",
                       "libraries": {"liger-kernel": "````` <img src=x onerror=alert(1)>"}}


@pytest.mark.parametrize("example, write", [
    ("recorded/lightning-bf16-mixed-h200", "fusedce_reports.recorded_report:write_recorded_report"),
    ("explain/user-gpt-22785-22155", "fusedce_reports.explain_report:write_explain_report"),
    ("model/model-eval", "fusedce_reports.model_report:write_model_report"),
])
def test_a_stored_environment_stays_inside_its_fence_on_every_page(tmp_path, example, write):
    """An ``environment.json`` value holding a fence, a closing ``</details>``, a tag and a heading
    is shown as text: every such line lies between the environment block's opening and closing fence."""
    import importlib
    import json
    import shutil

    folder = tmp_path / "run"
    shutil.copytree(Path(__file__).resolve().parents[1] / "examples" / example, folder)
    stored = json.loads((folder / store.ENVIRONMENT_FILE).read_text())
    (folder / store.ENVIRONMENT_FILE).write_text(json.dumps({**stored, **HOSTILE_ENVIRONMENT}))
    module, function = write.split(":")
    page = Path(getattr(importlib.import_module(module), function)(folder))
    page = page if page.suffix == ".md" else folder / "summary.md"
    lines = page.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("`" * 6))  # longer than the value's 5
    end = next(i for i in range(start + 1, len(lines)) if lines[i] == lines[start].rstrip("text"))
    for needle in ("<script>", "# Verdict: PASS", "<img src=x"):
        where = [i for i, line in enumerate(lines) if needle in line]
        assert where and all(start < i < end for i in where), (needle, where, start, end)
    closing = [i for i, line in enumerate(lines) if line == "</details>"]
    assert [i for i in closing if not start < i < end] == [closing[-1]] and closing[-1] > end  # the page's own


def test_a_recorded_steps_stored_strings_are_text_on_its_page(tmp_path):
    """A received ``recorded_steps.jsonl`` put its label, model name, notes and head fields into the
    page's findings as Markdown: a remote image, a raw ``<img onerror>`` and a ``javascript:`` link."""
    import json
    import shutil

    from fusedce_reports.recorded_report import write_recorded_report

    folder = tmp_path / "run"
    shutil.copytree(Path(__file__).resolve().parents[1] / "examples" / "recorded" / "lightning-bf16-mixed-h200", folder)
    payload = "![px](https://attacker.example/{0}.png)<img src=x onerror=alert(1)>[c](javascript:alert(1))"
    rows = [json.loads(line) for line in (folder / store.RECORDED_STEPS_FILE).read_text().splitlines()]
    for row in rows:
        row.update(label=payload.format("label"), model=payload.format("model"), notes=[payload.format("notes")],
                   snapshot="snapshots/s.pickle`\n# Injected heading\n" + payload.format("snapshot"))
        row["head"].update(path=payload.format("path"), found_by=payload.format("found_by"),
                           weight=payload.format("weight"), notes=[payload.format("head-notes")])
    (folder / store.RECORDED_STEPS_FILE).write_text("".join(json.dumps(row) + "\n" for row in rows))
    page = Path(write_recorded_report(folder)).read_text()
    for field in ("label", "model", "notes", "path", "found_by", "weight", "head-notes", "snapshot"):
        assert f"attacker.example/{field}" in page.replace("\\", ""), field  # shown …
    assert not re.search(r"(?<!\\)\]\((https|javascript)", page) and "<img" not in page  # … as text
    assert "\n# Injected" not in page  # a stored newline starts no line of the page
