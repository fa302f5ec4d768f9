"""``doctor``: a user's loss wrapper checked against the model's own loss.

- :mod:`~fusedce_profiler.judgements.doctor.doctor`: the contract and :func:`run_doctor`.
- :mod:`~fusedce_profiler.judgements.doctor.records`: the checks' list and what is stored (``doctor.json``).
- :mod:`~fusedce_profiler.judgements.doctor.observe`: what one loss call shows (the evidence).
- :mod:`~fusedce_profiler.judgements.doctor.variants`: the reference run and the known mistakes.
- :mod:`~fusedce_profiler.judgements.doctor.loss_options`: the config's loss options and the reference cross-entropy.
- :mod:`~fusedce_profiler.judgements.doctor.precision`: the tolerances, measured for the user's precision.
- :mod:`~fusedce_profiler.judgements.doctor.checks`: one judge per wiring check.
- :mod:`~fusedce_profiler.judgements.doctor.probes`: the loss called again as training calls it (a step,
  accumulation, an all-ignored batch, ``reduction="none"``, ``torch.compile``).
- :mod:`~fusedce_profiler.judgements.doctor.inspections`: the weight at the call, evaluation, the config's
  options, grad_W's accumulator.
- :mod:`~fusedce_profiler.judgements.doctor.job`: the worker job that runs the user's code.
"""
