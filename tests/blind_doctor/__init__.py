"""Blind cases for ``fusedce-profile doctor``: models and loss wrappers written without reading the
doctor's code or its own planted-bug suite, each labelled correct or buggy by construction.

:mod:`.models` holds the model factories, :mod:`.wrappers` the loss wrappers in the contract's
``fn(model, batch)`` form, :mod:`.cases` the table of (model, wrapper, truth).
"""
