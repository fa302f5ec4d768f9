"""The orchestration behind :func:`fusedce_profile.explain.explain`: calibrate, measure the noise,
judge, confirm on the GPU, conclude, store — and, when interrupted, store what finished.

Order of work: every family's calibration steps (naive and fused back-end at each calibration
batch size), then one calibration step repeated (the run-to-run noise of a reading), then the
analytic judging (no measurement), then, on a GPU, the full-size confirmations of the best
consistent hypotheses under the card's cap. Each step goes through ``run_job(job, purpose)``,
which stores it as it finishes and reuses a stored one.
"""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from fusedce_profiler.instrument import staging


class ExplainRun:
    """One explanation being computed (see the module's account); :meth:`execute` runs it."""

    def __init__(self, obs, source, base, families, batches: tuple[int, ...] | None, out: Path, *, on_gpu: bool,
                 confirm: int, stand_in: bool, progress: Callable[[str], None]) -> None:
        self.obs, self.source, self.base, self.families, self.batches = obs, source, base, families, batches
        self.out, self.on_gpu, self.confirm_top, self.stand_in, self.progress = out, on_gpu, confirm, stand_in, progress
        self.calibrations: list = []
        self.noise = 0.0
        self.hypotheses: list = []
        self.confirmations: list[str] = []
        self.confirmed = False
        self.step_error: dict[str, str] = {}  # back-end → its first failed (error / time-out) step's message

    def execute(self, run_job):
        from fusedce_profiler.instrument.environment import collect_environment, save_environment

        save_environment(self.out, collect_environment())
        try:
            self._calibrate(run_job)
            self._measure_noise(run_job)
            terms = self._judge()
            if self.on_gpu and self.confirm_top:
                from fusedce_profiler.judgements.explain.verdict import confirm

                self.progress(f"confirming up to {self.confirm_top} consistent hypotheses at full size under the "
                              f"{self.obs.total_gib:g} GiB cap ...")
                self.confirmations = confirm(self.hypotheses, self.base, self.obs, terms,
                                             lambda jobs: [run_job(j, "confirm") for j in jobs], self.confirm_top,
                                             self.calibrations)
                self.confirmed = bool(self.confirmations)
        except KeyboardInterrupt:
            with staging.signals_held():  # a second signal cuts neither explain.json nor its page
                self._store(interrupted=True)
            raise
        with staging.signals_held():  # the finished explanation is stored whole; a signal now is taken after it
            from fusedce_profile.folders import report_errors
            from fusedce_profiler.instrument.text import resume_option

            # a full disk, a page that is a folder: the steps are kept, and judged again on resume
            again = f"the same command with {resume_option(self.out)} judges them"
            with report_errors(self.out, "the finished steps", again):
                return self._store(interrupted=False)

    def _calibrate(self, run_job) -> None:
        from fusedce_profiler.instrument.records import FAILED_STATUSES
        from fusedce_profiler.judgements.explain import calibration as cal

        for family, backend, jobs in cal.calibration_jobs(self.base, self.families, ("torch", self.obs.fused_backend),
                                                           self.batches):
            results = [run_job(job, "calibrate") for job in jobs]
            while any(r.status == "oom" for r in results) and jobs[-1].batch > 2:
                # a GPU smaller than the calibration step (the user's own card): halve the batches
                smaller = cal.halved([j.batch for j in jobs])
                jobs = [cal.family_job(self.base, family, backend, b) for b in smaller]
                results = [run_job(job, "calibrate") for job in jobs]
            for job, result in zip(jobs, results):
                if result.status in FAILED_STATUSES and backend not in self.step_error:
                    first = (result.message.strip().splitlines() or [result.status])[0]  # a traceback's first line
                    self.step_error[backend] = f"B={job.batch}: {first}"
            calibration = cal.calibration_from_results(family, backend, [j.batch for j in jobs], results)
            self.calibrations.append(calibration)
            self.progress(cal.describe(calibration))

    def _measure_noise(self, run_job) -> None:
        """Repeat the first naive calibration step at its largest batch: the spread of the
        reading between two identical steps (bytes)."""
        from fusedce_profiler.judgements.explain import calibration as cal

        first = next((c for c in self.calibrations if c.backend == "torch" and c.fitted), None)
        if first is None:
            return
        job = cal.family_job(self.base, first.family, "torch", first.batches[-1])
        again = run_job(job, "repeat")
        if again.status != "ok" or again.memory is None:
            return
        m = again.memory
        now = m.smi_peak if m.smi_peak is not None else m.peak
        before = (first.reserved[-1] + first.context[-1]) if first.reserved[-1] is not None and \
            first.context[-1] is not None else first.figures[-1]
        if before is not None:
            self.noise = abs(now - before)

    def _terms(self):
        from fusedce_profiler.judgements.explain.allocator import device_terms

        config = self.source.config if self.source is not None else None
        return device_terms(self.obs, self.calibrations, cuda=self.on_gpu, noise=self.noise, stand_in=self.stand_in,
                            vocab=config.vocab_size if config else 0,
                            layers_hidden=config.num_hidden_layers * config.hidden_size if config else 0)

    def _judge(self):
        from fusedce_profiler.judgements.explain.verdict import build_hypotheses

        terms = self._terms()
        self.hypotheses = build_hypotheses(self.obs, self.calibrations, terms)
        return terms

    def _step_counts(self, backend: str) -> tuple[int, int]:
        """(calibration steps of ``backend`` measured, failed with an error or a time-out)."""
        from fusedce_profiler.instrument.records import FAILED_STATUSES

        statuses = [s for c in self.calibrations if c.backend == backend for s in c.statuses]
        return statuses.count("ok"), sum(s in FAILED_STATUSES for s in statuses)

    def _store(self, *, interrupted: bool):
        from fusedce_profiler.judgements.explain import conclusion as con
        from fusedce_profiler.judgements.explain.others import other_hypotheses, ruled_out_groups
        from fusedce_profiler.judgements.explain.records import Explanation, save_explanation
        from fusedce_reports.explain_report import write_explain_report

        terms = self._terms()
        if not self.hypotheses and self.calibrations:
            from fusedce_profiler.judgements.explain.verdict import build_hypotheses

            self.hypotheses = build_hypotheses(self.obs, self.calibrations, terms)
        counts = {b: self._step_counts(b) for b in self.step_error}  # back-end → (steps measured, failed)
        failed = {b: message for b, message in self.step_error.items() if not counts[b][0]}
        partly = [f"{b}: {counts[b][1]} of {sum(counts[b])} calibration steps failed (the first, {message}); the "
                  f"judgement rests on the {counts[b][0]} that finished"
                  for b, message in self.step_error.items() if counts[b][0]]
        if failed:  # a judgement on failed steps would be a claim about nothing measured
            self.hypotheses = []
        consistent = [h for h in self.hypotheses if h.consistent]
        measured = self.on_gpu and bool(consistent) and all(h.measured_naive is not None for h in consistent)
        decided, conclusion = con.conclude(self.hypotheses, self.obs, measured=measured and not interrupted)
        if failed:
            decided, conclusion = False, (
                f"nothing judged: {', '.join(failed)} failed in every calibration step (its first failure is "
                "below); fix it and run again with --resume (the steps that finished are kept)")
        notes = []
        if not self.on_gpu:
            notes.append("Predictions only: on the CPU the figures are peak allocated bytes of the steps (no allocator "
                         "cache, no CUDA context), not nvidia-smi figures, and no full-size step can confirm them; "
                         "run explain on the GPU the readings came from for a verdict.")
        if interrupted:
            notes.append("Interrupted: the steps finished so far are kept in explain_steps.jsonl; continue with the "
                         "same command and --resume.")
        notes.append(f"Tolerance terms: run-to-run noise {terms.noise / (1 << 20):,.0f} MiB (measured by repeating a "
                     f"step); model mismatch {terms.mismatch:.0%} of the step ("
                     f"{'a stand-in preset' if self.stand_in else 'your own model'}); context "
                     f"{terms.context / (1 << 20):,.0f} ± {terms.context_spread / (1 << 20):,.0f} MiB "
                     f"({'stated' if self.obs.context_mib is not None else 'measured here; your GPU class may differ'})"
                     f"; {_slack_note(terms)}; {_extra_note(terms)}.")
        vocab = self.source.config.vocab_size
        explanation = Explanation(
            observation=self.obs, model=self.source.describe(), source=self.source.to_dict(), device=self.base.device,
            metric="nvidia-smi on your card: context + the allocator's reserved bytes at the step's peak"
            if self.on_gpu else "PREDICTED peak allocated bytes of the CPU steps (not nvidia-smi)",
            calibrations=self.calibrations, hypotheses=self.hypotheses,
            separation=None if decided or failed else con.separating_measurement(self.hypotheses, self.obs, vocab),
            decided=decided and self.on_gpu, conclusion=conclusion, confirmed=self.confirmed, notes=notes,
            others=other_hypotheses(self.obs, self.hypotheses, self.calibrations, terms)
            if self.calibrations and not failed else [],
            confirmations=self.confirmations, ruled_out_families=ruled_out_groups(self.hypotheses, self.obs),
            prediction_only=not self.on_gpu, interrupted=interrupted, failed_backends=failed, failed_steps=partly)
        save_explanation(self.out, explanation)
        write_explain_report(self.out)
        return explanation


def _slack_note(terms) -> str:
    """The allocator's slack as the judging used it: the measured range per kind of step."""
    if not terms.slack:
        return "allocator slack scaled with each step's transient bytes, ±2% of the step plus half the slack"
    ranges = ", ".join(f"{backend} {attention}{' ckpt' if ckpt else ''} {lo:.2f}–{hi:.2f}"
                       for (backend, attention, ckpt), (lo, hi) in sorted(terms.slack.items()))
    return ("allocator slack (reserved − allocated at the peak) in units of one bf16 logits copy B·T·V·2, the "
            f"range measured over the calibration steps of each kind: {ranges}; predicted at its middle, ± half its "
            "width and 2% of the step")


def _extra_note(terms) -> str:
    if terms.extra_per_token <= 0:
        return "no extra activations allowed (your own model)"
    return (f"another implementation of the stand-in may keep 0–{terms.extra_per_token / 1024:,.0f} KiB of activations "
            "per token more (measured spread between two implementations), the same in both steps")

