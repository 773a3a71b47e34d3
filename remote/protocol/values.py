"""The value vocabulary of the contract: what counts as a whole number, how a bad value is
shown in a message, and the one error a bad spec value raises (`SpecError`)."""

from __future__ import annotations

import math
import reprlib


class SpecError(ValueError):
    """A value no eval can run with; the message is one line saying what to use instead."""


def is_int(value: object) -> bool:
    """Whether `value` is a whole number (a JSON integer): an int, never a bool."""
    return isinstance(value, int) and not isinstance(value, bool)


def finite(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


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
