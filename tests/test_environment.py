"""The environment block: library versions from package metadata."""
from importlib.metadata import PackageNotFoundError, version

from fusedce_profiler.instrument.environment import LIBRARIES, collect_environment


def test_the_environment_names_the_version_of_every_model_library_or_says_not_installed():
    libraries = collect_environment()["libraries"]
    assert set(libraries) == set(LIBRARIES)
    for name, shown in libraries.items():
        try:
            assert shown == version(name)
        except PackageNotFoundError:
            assert shown == "not installed"


def test_the_environment_is_collected_without_importing_triton():
    """The command collects it in its own process, where a signal's exception arriving inside Triton's
    start (a C extension calling back into Python) aborted the process: its version is read from
    the installed metadata instead."""
    import subprocess
    import sys

    probe = ("import sys\nfrom fusedce_profiler.instrument.environment import collect_environment\n"
             "found = collect_environment()['triton']\nprint(found, 'triton' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    try:
        installed = version("triton")
    except PackageNotFoundError:
        installed = None
    assert done.stdout.split() == [str(installed), "False"], done.stderr


def _damaged_distribution(folder, name: str, metadata: bytes | None) -> None:
    """A ``name-9.9.dist-info`` in ``folder`` whose METADATA holds ``metadata`` (None: a folder in its place)."""
    info = folder / f"{name}-9.9.dist-info"
    info.mkdir()
    if metadata is None:
        (info / "METADATA").mkdir()
    else:
        (info / "METADATA").write_bytes(metadata)


def test_damaged_package_metadata_is_recorded_as_unreadable_never_an_exception(tmp_path):
    """A METADATA that is not UTF-8, a folder in its place, or one without a Version line: every
    command records the environment first, so reading it must not end the command (a traceback in
    ``env`` and ``doctor``, "bad input" in ``grid`` and ``model``). Such a library is shown as
    installed with an unreadable version; Triton's own version then comes from Triton itself."""
    import subprocess
    import sys

    _damaged_distribution(tmp_path, "lightning", b"Metadata-Version: 2.1\nName: lightning\nVersion: 2.0\xff\n")
    _damaged_distribution(tmp_path, "transformers", None)
    _damaged_distribution(tmp_path, "triton", b"Metadata-Version: 2.1\nName: triton\n")
    probe = ("import json\nfrom fusedce_profiler.instrument.environment import collect_environment\n"
             "found = collect_environment()\nprint(json.dumps([found['libraries'], found['triton']]))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120,
                          env={**__import__("os").environ, "PYTHONPATH": str(tmp_path)})
    assert done.returncode == 0, done.stderr
    import json

    libraries, triton = json.loads(done.stdout)
    assert libraries["lightning"] == libraries["transformers"] == "unknown (its metadata cannot be read)"
    try:
        import triton as installed  # noqa: F401 - the real one, beside the damaged metadata

        assert triton == installed.__version__
    except ImportError:
        assert triton == "unknown (its metadata cannot be read)"


def test_a_triton_whose_import_exits_is_recorded_not_obeyed(tmp_path):
    """Unreadable metadata sends the version to Triton itself; an installation whose import calls
    ``sys.exit(3)`` ended ``env`` with exit 3 and no word. The environment is recorded instead."""
    import json
    import os
    import subprocess
    import sys

    _damaged_distribution(tmp_path, "triton", b"Metadata-Version: 2.1\nName: triton\n")
    (tmp_path / "triton").mkdir()
    (tmp_path / "triton" / "__init__.py").write_text("import sys\nsys.exit(3)\n")
    probe = ("import json\nfrom fusedce_profiler.instrument.environment import collect_environment\n"
             "print(json.dumps(collect_environment()['triton']))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(tmp_path)})
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == "unknown (its metadata cannot be read)"


def test_later_sessions_beyond_twenty_are_counted_in_one_line():
    """340,000 empty sessions under ``resumed`` (within the file's size limit) made a 340,000-line summary."""
    from fusedce_reports.environment import MAX_SESSIONS_SHOWN, environment_lines

    lines = environment_lines({"torch": "2.13", "resumed": [{}] * 340_000})
    assert len(lines) == 1 + MAX_SESSIONS_SHOWN + 1
    assert lines[-1] == f"resumed[{MAX_SESSIONS_SHOWN + 1}–340000]: 339,980 more sessions, not shown"


def test_a_stored_newline_is_spelled_so_no_value_adds_lines_or_ends_the_code_block():
    """A folder's ``platform`` holding a fence and a heading rendered as live Markdown in ``summary.md``,
    and 330,000 newlines made a 330,000-line page."""
    from fusedce_reports.environment import environment_lines
    from fusedce_reports.escape import code_block

    payload = "Linux\n```\n\n# INJECTED HEADING\n\n[fix](https://example.invalid/fix.sh)\n```text"
    lines = environment_lines({"platform": payload, "k\ney": ["a\nb", "c"], "many": "x\n" * 330_000})
    assert lines[:2] == ["platform: Linux\\n```\\n\\n# INJECTED HEADING\\n\\n[fix](https://example.invalid/fix.sh)"
                         "\\n```text", "k\\ney: a\\nb, c"]
    block = code_block(lines)
    assert len(block) == 2 + 3 and not any(line.startswith("#") for line in block)
    assert len(block[3]) < 2_100  # the long value cut at the page's limit for one line
