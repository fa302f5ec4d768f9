"""Worker start-up with and without the worker template, in one process each (``FUSEDCE_WORKER_TEMPLATE``
set by the caller): the wall time from ``Worker()`` to the first job's reply, for three workers in a row,
and the process's CPU time (itself and its waited children). Usage: python benchmarks/device/worker_start_ab.py OUT.json"""
import json
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.getcwd())
from fusedce_profiler.instrument.worker import Worker  # noqa: E402

folder = Path(tempfile.mkdtemp())
times = []
for _ in range(3):
    started = time.perf_counter()
    with Worker(folder / "logs", preload=("environment",)) as worker:
        worker.call("environment", {}, 300)
        kind = type(worker._process).__name__
    times.append(round(time.perf_counter() - started, 3))
from fusedce_profiler.instrument.template import close_template  # noqa: E402

close_template()
own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
result = {"template": os.environ.get("FUSEDCE_WORKER_TEMPLATE", "1"), "kind": kind, "seconds_to_first_reply": times,
          "cpu_s": round(own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime, 2)}
print(json.dumps(result))
Path(sys.argv[1]).write_text(json.dumps(result))
