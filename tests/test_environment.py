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
