"""Worker process: ``python -m profiler.model.worker JOB.json RESULT.json``.

Reads a :class:`~profiler.model.run.ModelJob` (as JSON), runs it, writes the
:class:`~profiler.model.run.ModelResult` as JSON. Used by ``run_job_subprocess``.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from profiler.configs import ModelConfig
from profiler.model.run import ModelJob, run_job


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m profiler.model.worker JOB.json RESULT.json", file=sys.stderr)
        return 2
    raw = json.loads(Path(argv[0]).read_text())
    raw["config"] = ModelConfig(**raw["config"])
    result = run_job(ModelJob(**raw))
    Path(argv[1]).write_text(json.dumps(result.to_dict()))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
