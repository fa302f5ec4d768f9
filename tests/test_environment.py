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
