"""``python -m fusedce_cli``: the same as the ``fusedce-profile`` console script."""
from fusedce_cli.entry import main

main()
