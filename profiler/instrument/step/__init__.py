"""One measured training step of a model, with each loss back-end.

- :mod:`~fusedce_profiler.instrument.step.step`: the measured step (warm-up, meter, trace).
- :mod:`~fusedce_profiler.instrument.step.memory`: its memory, the composition of its peak, the saved tensors.
- :mod:`~fusedce_profiler.instrument.step.jobs`: a step as a job, run here or in a worker process.
- :mod:`~fusedce_profiler.instrument.step.losses`: the loss back-ends as a training step calls them.
- :mod:`~fusedce_profiler.instrument.step.patching`: back-ends that patch more than the loss.
- :mod:`~fusedce_profiler.instrument.step.data`: learnable synthetic token data.
"""
