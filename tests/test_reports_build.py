"""``build_report`` on the stored H200 fixture: files, numbers, plots, self-contained HTML."""
import csv
import json
import shutil
from pathlib import Path

import matplotlib.image
import pytest

from fusedce_profiler.instrument.records import CellResult
from fusedce_profiler.grid.runner import load_results
from fusedce_reports import build_report

FIXTURE = Path(__file__).parent / "fixtures" / "h200_anchors"
GIB = 1 << 30


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("run")
    for name in ("results.jsonl", "environment.json"):
        shutil.copy(FIXTURE / name, run_dir / name)
    return build_report(run_dir)


def _fixture_rows():
    return [CellResult.from_dict(json.loads(line)) for line in (FIXTURE / "results.jsonl").read_text().splitlines()]


def _table_lines(summary: str, title: str) -> list[str]:
    section = summary.split(f"### {title}\n", 1)[1].lstrip("\n").split("\n\n", 1)[0]
    return [line for line in section.splitlines() if line.startswith("| ") and not line.startswith("| back-end")]


def test_summary_table_rows_carry_the_fixture_peaks_and_times(report):
    summary = report.summary.read_text()
    lines = _table_lines(summary, "H=768 V=32777 · amp-bf16 · cuda")
    rows = {line.split(" | ")[0].strip("| "): line for line in lines}
    for result in _fixture_rows():
        spec = result.spec
        if (spec.hidden, spec.vocab, spec.mode) != (768, 32777, "amp-bf16"):
            continue
        line = rows[spec.backend]
        assert f"{result.peak_step_bytes / GIB:.2f} GiB" in line or f"{result.peak_step_bytes / (1 << 20):.0f} MiB" in line
        assert f"{result.time_ms:.1f} ms" in line or f"{result.time_ms:.2f} ms" in line
        assert f"{result.peak_step_bytes / result.floor_bytes:.2f}" in line


def test_summary_saving_matches_the_fixture_arithmetic(report):
    rows = {(r.spec.backend, r.spec.tokens): r for r in _fixture_rows()
            if (r.spec.hidden, r.spec.vocab, r.spec.mode) == (4096, 128256, "amp-bf16")}
    saving = rows[("torch", 32768)].peak_step_bytes - rows[("cce", 32768)].peak_step_bytes
    share = saving / rows[("torch", 32768)].peak_step_bytes
    line = next(l for l in _table_lines(report.summary.read_text(), "H=4096 V=128256 · amp-bf16 · cuda")
                if l.startswith("| cce | 32k"))
    assert f"{saving / GIB:.1f} GiB ({100 * share:.0f}%)" in line
    # ANCHORS.md: torch 40.119 GiB, cce 3.187 GiB at 32768×4096×128256 amp.
    assert "36.9 GiB (92%)" in line


def test_summary_reports_the_oom_cell_and_its_request(report):
    summary = report.summary.read_text()
    assert "| torch | 128k | OOM (asked 62.6 GiB) |" in summary
    assert "torch runs out of memory at 128k tokens" in summary


def test_summary_has_environment_measurement_and_findings_sections(report):
    summary = report.summary.read_text()
    for heading in ("## Findings", "## Results", "## Plots", "## How it was measured", "<summary>Environment</summary>"):
        assert heading in summary
    assert "gpu: NVIDIA H200" in summary and "backends.liger: 0.8.5" in summary
    assert "**allocated (reported)**" in summary and "**nvidia-smi**" in summary


def test_summary_links_every_plot_relative_to_the_run_folder(report):
    summary = report.summary.read_text()
    for path in report.plots.values():
        assert f"](plots/{path.name})" in summary


@pytest.mark.parametrize("name", ["peak_memory", "saving", "saving_heatmap", "time", "frontier", "parity"])
def test_plots_exist_at_github_width(report, name):
    path = report.plots[name]
    image = matplotlib.image.imread(path)
    height, width = image.shape[:2]
    assert 800 <= width <= 1600, width
    assert 300 <= height <= 2400, height
    assert path.stat().st_size > 20_000  # a drawn figure, not an empty canvas


def test_the_frontier_plot_is_embedded_and_its_finding_names_the_pareto_set(report):
    summary = report.summary.read_text()
    assert "![Time–memory frontier per head](plots/frontier.png)" in summary
    assert 'alt="Time–memory frontier per head"' in report.html.read_text()
    # ANCHORS.md at 32768×4096×128256 amp: cce 3.187 GiB / 471.8 ms, liger 4.409 GiB / 197.2 ms,
    # torch-compile 10.035 GiB / 162.0 ms, torch 40.119 GiB / 186.5 ms.
    assert ("On 4096×128256 at 32k tokens the time–memory frontier is cce (3.19 GiB, 472 ms), liger (4.41 GiB, "
            "197 ms) and torch-compile (10.0 GiB, 162 ms); torch is dominated by torch-compile.") in summary


def test_html_is_self_contained(report):
    page = report.html.read_text()
    assert page.count("data:image/png;base64,") == len(report.plots)
    assert "src=\"http" not in page and "href=\"http" not in page and "<script" not in page
    assert "36.9 GiB (92%)" in page


def test_csv_has_one_row_per_cell_with_raw_bytes(report):
    with report.csv.open() as fh:
        rows = list(csv.DictReader(fh))
    fixture = _fixture_rows()
    assert len(rows) == len(fixture)
    by_key = {(r["backend"], int(r["tokens"]), int(r["hidden"]), r["mode"]): r for r in rows}
    for result in fixture:
        row = by_key[(result.spec.backend, result.spec.tokens, result.spec.hidden, result.spec.mode)]
        if result.status == "ok":
            assert int(float(row["peak_bytes"])) == result.peak_step_bytes
        assert row["status"] == result.status


def test_rebuilding_removes_its_own_stale_plots_and_nothing_else(report):
    stale = report.run_dir / "plots" / "timeline_of_a_cell_no_longer_listed.png"
    stale.write_bytes(b"not a plot")
    users = report.run_dir / "plots" / "my_notes.png"
    users.write_bytes(b"the user's own file")
    rebuilt = build_report(report.run_dir)
    assert not stale.exists() and users.read_bytes() == b"the user's own file"
    assert set(rebuilt.plots) == set(report.plots)


def test_a_truncated_last_line_is_skipped_and_named(tmp_path):
    lines = (FIXTURE / "results.jsonl").read_text().splitlines()
    path = tmp_path / "results.jsonl"
    path.write_text("\n".join(lines[:3]) + "\n" + lines[3][: len(lines[3]) // 2])
    loaded = load_results(path)
    assert len(loaded.records) == 3 and "interrupted write" in loaded.problems[0] and ":4:" in loaded.problems[0]


def test_a_malformed_middle_line_is_skipped_and_the_report_says_so(tmp_path):
    lines = (FIXTURE / "results.jsonl").read_text().splitlines()
    (tmp_path / "results.jsonl").write_text("\n".join([lines[0], "{not json", lines[1]]) + "\n")
    report = build_report(tmp_path)
    assert len(report.frame) == 2 and any(":2:" in note for note in report.notes)
    assert "Incomplete or damaged" in report.summary.read_text() and ":2:" in report.html.read_text()


def test_an_ill_typed_row_is_skipped_naming_the_field(tmp_path):
    row = json.loads((FIXTURE / "results.jsonl").read_text().splitlines()[0])
    row["spec"]["tokens"] = "many"
    (tmp_path / "results.jsonl").write_text(json.dumps(row) + "\n")
    loaded = load_results(tmp_path)
    assert loaded.records == [] and "spec.tokens" in loaded.problems[0]


def test_empty_results_give_a_report_without_plots(tmp_path):
    (tmp_path / "results.jsonl").write_text("")
    report = build_report(tmp_path)
    assert report.plots == {}
    assert "No cells were measured" in report.summary.read_text()
    assert json.loads(json.dumps(report.findings)) == []


def test_timeline_is_redrawn_from_the_stored_timeline_of_a_moved_run_folder(tmp_path):
    from fusedce_profiler.instrument import store
    from fusedce_profiler.instrument.snapshot import parse_timeline
    from test_profiler_snapshot import synthesise_snapshot

    store.write_json(tmp_path / "snapshots" / "torch_cell.timeline.json", parse_timeline(synthesise_snapshot()).to_dict())
    row = _fixture_rows()[0]
    row.snapshot_path = "/elsewhere/original-run/snapshots/torch_cell.pickle"  # where it was recorded
    row.timeline_path = "/elsewhere/original-run/snapshots/torch_cell.timeline.json"
    (tmp_path / "results.jsonl").write_text(store.dumps(row.to_dict()) + "\n")
    report = build_report(tmp_path)
    (timeline,) = report.timelines
    assert timeline.name == "timeline_torch_cell.png" and timeline.stat().st_size > 10_000
    assert f"](plots/{timeline.name})" in report.summary.read_text()


def test_report_never_opens_a_pickle_from_the_folder(tmp_path):
    """A run folder is something users receive from strangers: a malicious pickle beside the
    results must not run. The planted files would create ``pwned`` if unpickled."""
    import pickle

    from fusedce_profiler.instrument import store

    marker = tmp_path / "pwned"

    class Payload:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    (tmp_path / "snapshots").mkdir()
    for name in ("torch_cell.pickle", "torch_cell.pickle.gz"):
        (tmp_path / "snapshots" / name).write_bytes(pickle.dumps(Payload()))
    row = _fixture_rows()[0]
    row.snapshot_path = "snapshots/torch_cell.pickle"
    row.timeline_path = None
    (tmp_path / "results.jsonl").write_text(store.dumps(row.to_dict()) + "\n")
    report = build_report(tmp_path)
    assert not marker.exists()
    assert report.timelines == [] and any("never opens a pickle" in note for note in report.notes)


def test_a_timeline_plot_whose_timeline_file_is_absent_is_kept(tmp_path):
    from fusedce_profiler.instrument import store

    row = _fixture_rows()[0]
    row.snapshot_path = "snapshots/torch_cell.pickle.gz"  # recorded by an older version: no timeline file
    (tmp_path / "results.jsonl").write_text(store.dumps(row.to_dict()) + "\n")
    (tmp_path / "plots").mkdir()
    drawn_before = tmp_path / "plots" / "timeline_torch_cell.png"
    drawn_before.write_bytes(b"png drawn by an earlier build")
    build_report(tmp_path)
    assert drawn_before.read_bytes() == b"png drawn by an earlier build"
