"""Ctrl-C, SIGTERM and SIGHUP: the public API's handling (:mod:`fusedce_profile.signals`)."""
from fusedce_profile.signals import Terminated, interrupt_exit_code, stop_on_sigterm

__all__ = ["Terminated", "interrupt_exit_code", "stop_on_sigterm"]
