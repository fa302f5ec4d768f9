"""``env``, ``backends``, ``presets`` and the registration of the model commands."""
import json

from typer.testing import CliRunner

from fusedce_cli.app import app
from fusedce_profiler.instrument.backends import BUILTIN_BACKENDS


def test_env_prints_versions_and_json():
    import torch

    text = CliRunner().invoke(app, ["env"])
    assert text.exit_code == 0 and f"torch: {torch.__version__}" in text.stdout
    data = json.loads(CliRunner().invoke(app, ["env", "--json"]).stdout)
    assert data["torch"] == torch.__version__ and "fusedce" in data["backends"]


def test_backends_lists_every_builtin_with_installation_state():
    result = CliRunner().invoke(app, ["backends", "--json"])
    assert result.exit_code == 0
    infos = {i["name"]: i for i in json.loads(result.stdout)}
    assert set(infos) == set(BUILTIN_BACKENDS)
    assert infos["torch"]["available"] and infos["fusedce"]["available"]
    table = CliRunner().invoke(app, ["backends"]).stdout
    assert all(name in table for name in BUILTIN_BACKENDS)


def test_presets_include_the_users_model_and_llama3():
    data = json.loads(CliRunner().invoke(app, ["presets", "--json"]).stdout)
    assert (data["user-gpt"]["hidden_size"], data["user-gpt"]["vocab_size"]) == (768, 32777)
    assert (data["llama-3-8b"]["hidden_size"], data["llama-3-8b"]["vocab_size"]) == (4096, 128256)
    assert "gemma-2-2b" in CliRunner().invoke(app, ["presets"]).stdout


def test_help_lists_every_command_and_the_exit_codes():
    result = CliRunner().invoke(app, ["--help"])
    assert result.exit_code == 0
    out = " ".join(result.stdout.split())
    for command in ("grid", "report", "env", "backends", "presets"):
        assert command in out
    assert "1 a check failed (parity or doctor" in out


def test_model_commands_are_registered_when_their_module_exists():
    import importlib.util

    from fusedce_cli.app import MODEL_COMMANDS

    names = {c.name or c.callback.__name__ for c in app.registered_commands}
    for name, module_name in MODEL_COMMANDS.items():
        assert (name in names) == (importlib.util.find_spec(module_name) is not None), name
