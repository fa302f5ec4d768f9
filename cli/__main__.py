"""``python -m fusedce_cli``: the same as the ``fusedce-profile`` console script."""
from fusedce_cli.app import main

main()
