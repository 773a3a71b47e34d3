"""The contract's one vocabulary of value types (`Check`: a test and its words)."""

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
    return reprlib.repr(value)


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
    """One value type: `check`, its words `expected`, its failing `message`."""

    __slots__ = ("expected", "test", "choices", "inner", "keys")

    def __init__(
        self,
        expected: str,
        test: Callable[[Any], bool],
        choices: tuple[str, ...] = (),
        inner: Any = None,
        keys: Check | None = None,
    ) -> None:
        self.expected, self.test, self.choices = expected, test, choices
        self.inner, self.keys = inner, keys

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


def accepts(t: Check | dict, value: Any) -> bool:
    """Whether `value` is of type `t`: a `Check`, or a field table (any JSON object)."""
    return isinstance(value, dict) if isinstance(t, dict) else t(value)


def any_of(*types: Check | dict) -> Check:
    """A value of any of `types` (a field table counts as ``an object``)."""
    what = " or ".join(t.expected if isinstance(t, Check) else "an object" for t in types)
    return Check(what, lambda v: any(accepts(t, v) for t in types), inner=types)


def list_of(item: Check | dict) -> Check:
    """A list whose items are each of type `item`."""
    return Check("a list", lambda v: isinstance(v, list), inner=item)


def map_of(value: Check | dict, keys: Check | None = None) -> Check:
    """An object whose keys are data (budgets, lengths, names), each value of one type."""
    return Check("an object", lambda v: isinstance(v, dict), inner=value, keys=keys)


# What the job document's settings take.
COUNT = Check("a whole number of at least 1", lambda v: is_int(v) and v >= 1)
WHOLE = Check("a whole number", is_int)
TEXT = Check("a non-empty string", lambda v: isinstance(v, str) and v != "")
FLAG = Check("true or false", lambda v: isinstance(v, bool))
SHA256 = Check(
    "a sha256 (64 lowercase hex digits)",
    lambda v: isinstance(v, str) and len(v) == 64 and all(c in "0123456789abcdef" for c in v),
)
# The result files' fields (with `FLAG`).
STR = Check("a string", lambda v: isinstance(v, str))
INT = Check("an integer", is_int)
NUM = Check("a number", is_number)
SCALAR = Check("a string or a number", lambda v: isinstance(v, str) or is_number(v))
ANY = Check("anything", lambda v: True)
WHOLE_NUMBER_KEYS = Check("a whole number", lambda k: isinstance(k, str) and k.isdecimal())
# The job answers' fields (with `WHOLE` and `FLAG`).
ANY_TEXT = Check("text", lambda v: isinstance(v, str))
COUNT_FROM_0 = Check("a whole number of at least 0", lambda v: is_int(v) and v >= 0)
FINITE = Check("a finite number", finite)
OBJECT = Check("a JSON object", lambda v: isinstance(v, dict))


def type_words(value: object) -> str:
    """What `value` is, in the result files' words (``an integer``, ``a string``)."""
    for t in (FLAG, STR, INT, NUM):
        if t(value):
            return t.expected
    return {dict: "an object", list: "a list"}.get(type(value), type(value).__name__)
