"""The ``fusedce-profile`` command line."""
