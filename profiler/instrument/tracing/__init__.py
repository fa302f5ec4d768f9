"""The traced peak of a step: every allocation classified by module, kind, op and source line.

- :mod:`~fusedce_profiler.instrument.tracing.trace`: :class:`StepTracer` and the attribution of a step.
- :mod:`~fusedce_profiler.instrument.tracing.classify`: one allocation of the profiler's event tree.
- :mod:`~fusedce_profiler.instrument.tracing.attribution`: the records and the logits verdict.
"""
