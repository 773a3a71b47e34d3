"""The value vocabulary of the contract: what counts as a whole number, the checks a setting
passes on either side (`Check`), how a bad value is shown in a message, and the one error a
bad spec value raises (`SpecError`).

A `Check` says whether a value passes and, in words, what it expects; each side names the
setting its own way (the host ``the ground-truth concurrency``, the command line
``--gt-concurrency``, the inventory ``roles.eval.ground_truth_concurrency``) around the
same test and the same words.
"""

from __future__ import annotations

import math
import reprlib
from collections.abc import Callable
from typing import Any


class SpecError(ValueError):
    """A value no eval can run with; the message is one line saying what to use instead."""


def is_int(value: object) -> bool:
    """Whether `value` is a whole number (a JSON integer): an int, never a bool."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: object) -> bool:
    """Whether `value` is a JSON number: an int or a float, never a bool."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def finite(v: object) -> bool:
    return is_number(v) and math.isfinite(v)


def shown(value: object) -> str:
    return reprlib.repr(value)  # bounded however big the value is


def json_type(value: object) -> str:
    for kinds, name in (
        (bool, "true/false"),
        (dict, "a JSON object"),
        (list, "a list"),
        (str, "text"),
        ((int, float), "a number"),
    ):
        if isinstance(value, kinds):
            return name
    return "null" if value is None else type(value).__name__


class Check:
    """One setting's test: `check(value)` says whether `value` passes, `expected` what it
    must be, in words; `message(label, value)` is the line for a value that fails, naming
    the setting as `label` (a choice: ``unknown <label> 'x' (one of a, b)``; otherwise
    ``<label> must be <expected>, got 'x'``)."""

    __slots__ = ("expected", "test", "choices")

    def __init__(
        self, expected: str, test: Callable[[Any], bool], choices: tuple[str, ...] = ()
    ) -> None:
        self.expected, self.test, self.choices = expected, test, choices

    def __call__(self, value: Any) -> bool:
        return bool(self.test(value))

    def message(self, label: str, value: Any) -> str:
        if self.choices:
            return f"unknown {label} {shown(value)} (one of {', '.join(self.choices)})"
        return f"{label} must be {self.expected}, got {shown(value)}"

    def require(self, label: str, value: Any) -> Any:
        """`value` if it passes, else a `SpecError` with `message`."""
        if not self(value):
            raise SpecError(self.message(label, value))
        return value


def one_of(*choices: str) -> Check:
    """The check of a value that must be one of `choices` (exactly, as text)."""
    return Check(
        "one of " + ", ".join(choices),
        lambda v: isinstance(v, str) and v in choices,
        choices,
    )


COUNT = Check("a whole number of at least 1", lambda v: is_int(v) and v >= 1)
WHOLE = Check("a whole number", is_int)
TEXT = Check("a non-empty string", lambda v: isinstance(v, str) and v != "")
FLAG = Check("true or false", lambda v: isinstance(v, bool))
SHA256 = Check(
    "a sha256 (64 lowercase hex digits)",
    lambda v: isinstance(v, str) and len(v) == 64 and all(c in "0123456789abcdef" for c in v),
)
