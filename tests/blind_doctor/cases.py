"""The blind cases: (model factory, loss wrapper, truth), truth decided by construction.

``expect`` is ``()`` for a correct wrapper (doctor must exit 0), else the items of which at least one
must fail (doctor must exit 1 naming it). ``modes`` lists the precisions the truth holds in.
"""
from __future__ import annotations

from dataclasses import dataclass

PACKAGE = "tests.blind_doctor"
BOTH = ("fp32", "amp-bf16")


@dataclass(frozen=True)
class Case:
    model: str
    wrapper: str
    expect: tuple[str, ...] = ()
    modes: tuple[str, ...] = BOTH

    @property
    def name(self) -> str:
        return f"{self.model}/{self.wrapper}"

    @property
    def model_spec(self) -> str:
        return f"{PACKAGE}.models:{self.model}"

    @property
    def loss_spec(self) -> str:
        return f"{PACKAGE}.wrappers:{self.wrapper}"

    def judged_right(self, exit_code: int, failed: list[str]) -> bool:
        """Whether doctor's answer (exit code, failed items) is this case's truth: exit 0 for a correct
        wrapper; exit 1 with one of the expected items failed for a buggy one."""
        if not self.expect:
            return exit_code == 0
        return exit_code == 1 and any(item in failed for item in self.expect)

    @property
    def truth(self) -> str:
        return "correct" if not self.expect else "bug: " + " or ".join(self.expect)


ALL_MODELS = ("plain_gpt", "tied_gpt", "softcap_gpt", "scaled_gpt", "hf_gpt2", "hf_llama_untied", "hf_llama_tied",
              "hf_llama_smoothed")

_CORRECT = {
    "correct_slice": ALL_MODELS,
    "correct_roll": ("plain_gpt", "tied_gpt", "softcap_gpt", "hf_llama_tied"),
    "correct_collator": ("scaled_gpt", "hf_gpt2", "hf_llama_smoothed"),
    "correct_sum_over_items": ("plain_gpt", "softcap_gpt", "hf_llama_untied"),
    "correct_base_then_head": ("hf_gpt2", "hf_llama_untied", "hf_llama_tied", "hf_llama_smoothed"),
    "correct_compiled": ("tied_gpt", "scaled_gpt", "hf_llama_untied"),
}

_BUGGY = {  # wrapper: (models, items of which one must fail)
    "buggy_no_shift": (("plain_gpt", "hf_gpt2"), ("shift",)),
    "buggy_wrong_direction": (("tied_gpt", "hf_llama_untied"), ("shift",)),
    "buggy_detached": (("scaled_gpt", "hf_llama_tied"), ("body",)),
    "buggy_stale_clone": (("plain_gpt", "hf_llama_untied"), ("weight", "fresh")),
    "buggy_stale_data": (("tied_gpt", "hf_gpt2"), ("weight", "gradient")),
    "buggy_untied_copy": (("tied_gpt", "hf_gpt2", "hf_llama_tied"), ("tie", "weight", "gradient")),
    "buggy_mean_with_padding": (("plain_gpt", "hf_llama_smoothed"), ("reduction", "ignore")),
    "buggy_pad_as_zero": (("tied_gpt", "hf_llama_untied"), ("ignore",)),
    "buggy_ignore_zero": (("plain_gpt", "hf_gpt2"), ("ignore",)),
    "buggy_softcap_forgotten": (("softcap_gpt",), ("transform",)),
    "buggy_multiplier_forgotten": (("scaled_gpt",), ("transform",)),
    "buggy_smoothing_forgotten": (("hf_llama_smoothed",), ("options",)),
    "buggy_sum": (("softcap_gpt", "hf_llama_tied"), ("reduction",)),
    "buggy_ignores_num_items": (("plain_gpt", "hf_llama_untied"), ("accumulation",)),
    "buggy_bf16_grad_sum": (("plain_gpt", "hf_llama_untied"), ("precision",)),
}

def case(name: str) -> Case:
    """The case called ``model/wrapper``."""
    return next(c for c in CASES if c.name == name)


CASES: tuple[Case, ...] = (
    tuple(Case(m, w) for w, models in _CORRECT.items() for m in models)
    # the wrapper's own bf16 autocast is the model's training precision only under --mode amp-bf16
    + tuple(Case(m, "correct_autocast", modes=("amp-bf16",)) for m in ("plain_gpt", "hf_gpt2"))
    + tuple(Case(m, w, expect) for w, (models, expect) in _BUGGY.items() for m in models)
)
