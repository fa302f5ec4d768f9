"""``doctor``: a user's loss wrapper checked against the model's own loss.

- :mod:`~fusedce_profiler.judgements.doctor.doctor`: the contract, the records and :func:`run_doctor`.
- :mod:`~fusedce_profiler.judgements.doctor.observe`: what one loss call shows (the evidence).
- :mod:`~fusedce_profiler.judgements.doctor.variants`: the reference run and the known mistakes.
- :mod:`~fusedce_profiler.judgements.doctor.checks`: one judge per check.
"""
