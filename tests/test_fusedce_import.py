"""``import fusedce`` and the CLI's start: what they load, and the names served on first use."""
import subprocess
import sys


def test_importing_fusedce_does_not_load_torch_dynamo():
    """torch._dynamo is ~1.2 s of imports on a two-core CPU: every command of the profiler and
    every user script paid it for the vocabulary-parallel loss's ``torch.compiler.disable``."""
    code = ("import sys, fusedce; loaded = 'torch._dynamo' in sys.modules; "
            "from fusedce import vocab_parallel_linear_cross_entropy; "
            "print(loaded, 'torch._dynamo' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.split() == ["False", "True"]


def test_importing_fusedce_or_starting_the_cli_loads_no_torch_pandas_or_matplotlib():
    """A command's start (its options parsed, bad input refused) took 2.4 s of imports on a two-core
    CPU, torch's 1.2 s among them; every command and every test of the CLI in a process of its own
    paid it. The loss and the reports import them on first use."""
    code = ("import sys, fusedce, fusedce_cli.app; "
            "print(sorted(m for m in ('torch', 'pandas', 'matplotlib') if m in sys.modules)); "
            "from fusedce import linear_cross_entropy, LinearCrossEntropyLoss; "
            "print(linear_cross_entropy.__module__, LinearCrossEntropyLoss.__module__, 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.splitlines() == ["[]", "fusedce.api fusedce.api True"]


def test_the_vocabulary_parallel_names_are_those_of_fusedce_parallel():
    import fusedce
    from fusedce import parallel

    assert fusedce.vocab_parallel_linear_cross_entropy is parallel.vocab_parallel_linear_cross_entropy
    assert fusedce.vocab_shard_bounds is parallel.vocab_shard_bounds
    assert set(fusedce.__all__) >= {"vocab_parallel_linear_cross_entropy", "vocab_shard_bounds"}


def test_the_public_submodules_are_attributes_of_a_bare_import():
    """``import fusedce`` then ``fusedce.api.linear_cross_entropy``: the submodule is imported on
    first use, as the loss's names are; ``dir()`` lists both."""
    import subprocess
    import sys

    probe = ("import fusedce, sys\nassert 'fusedce.api' not in sys.modules\n"
             "print(fusedce.api.linear_cross_entropy is fusedce.linear_cross_entropy, 'api' in dir(fusedce))\n"
             "import fusedce_reports\nprint('build_report' in dir(fusedce_reports))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert done.stdout.split() == ["True", "True", "True"], done.stderr
