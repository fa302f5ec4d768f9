"""The checks a command makes before it measures: the public API's (:mod:`fusedce_profile.checks`)."""
from fusedce_profile.checks import (SHORT_INSTALL_HINTS, check_backends, check_model_fits,
                                    install_hint)

__all__ = ["SHORT_INSTALL_HINTS", "check_backends", "check_model_fits", "install_hint"]
