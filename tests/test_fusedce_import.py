"""``import fusedce``: what it loads, and the vocabulary-parallel names it serves on first use."""
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


def test_the_vocabulary_parallel_names_are_those_of_fusedce_parallel():
    import fusedce
    from fusedce import parallel

    assert fusedce.vocab_parallel_linear_cross_entropy is parallel.vocab_parallel_linear_cross_entropy
    assert fusedce.vocab_shard_bounds is parallel.vocab_shard_bounds
    assert set(fusedce.__all__) >= {"vocab_parallel_linear_cross_entropy", "vocab_shard_bounds"}
