"""One measured training step of a model, with each loss back-end.

- :mod:`~fusedce_profiler.instrument.step.step`: the step and the composition of its peak.
- :mod:`~fusedce_profiler.instrument.step.jobs`: a step as a job, run here or in a worker process.
- :mod:`~fusedce_profiler.instrument.step.losses`: the loss back-ends as a training step calls them.
- :mod:`~fusedce_profiler.instrument.step.patching`: back-ends that patch more than the loss.
- :mod:`~fusedce_profiler.instrument.step.data`: learnable synthetic token data.
"""
