"""``python -m cli``: the same as the ``fusedce-profile`` console script."""
from cli.app import main

main()
