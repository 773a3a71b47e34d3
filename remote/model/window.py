"""A model's positions window from ``config.json``, torch-free (docs/context.md)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from remote.protocol.values import is_number

STRETCHING = ("linear", "dynamic", "yarn", "longrope", "llama3")


@dataclass(frozen=True)
class Window:
    """A model's positions window: configured, RoPE-scaled (`positions`), sliding layers."""

    max_positions: int | None
    rope_type: str
    factor: float | None
    original: int | None
    positions: int | None
    layers: int
    sliding: tuple[int, ...]
    sliding_window: int | None

    @property
    def reach(self) -> int | None:
        """The longest context full attention was built for; None when all slide."""
        return None if self.layers and len(self.sliding) == self.layers else self.positions

    def describe(self) -> str:
        """The window in words, with its scaling and sliding layers where it has them."""
        text = f"max_position_embeddings {self.max_positions}"
        if self.positions != self.max_positions:
            base = f"{self.original} x " if self.original else ""
            text += f" ({self.rope_type} rope scaling {base}{self.factor:g}: {self.positions})"
        if self.sliding:
            text += (
                f"; {len(self.sliding)} of {self.layers} layers slide "
                f"(window {self.sliding_window})"
            )
        return text

    def to_json(self) -> dict[str, Any]:
        return {
            "max_position_embeddings": self.max_positions,
            "rope_type": self.rope_type,
            "factor": self.factor,
            "original_max_position_embeddings": self.original,
            "positions": self.positions,
            "reach": self.reach,
            "sliding_layers": list(self.sliding),
            "sliding_window": self.sliding_window,
        }


def _number(v: Any) -> float | None:
    return float(v) if is_number(v) and v > 0 else None


def rope_scaling(cfg: dict) -> dict:
    """The config's RoPE scaling, ``rope_scaling`` or ``rope_parameters``."""
    params = cfg.get("rope_parameters")
    if (
        isinstance(params, dict)
        and params
        and "rope_type" not in params
        and "rope_theta" not in params
    ):
        params = params.get("full_attention", next(iter(params.values())))
    scaling = cfg.get("rope_scaling")
    for got in (params, scaling):
        if isinstance(got, dict) and (got.get("rope_type") or got.get("type")) not in (
            None,
            "default",
        ):
            return got
    return {}


def text_config(cfg: dict) -> dict:
    """A model config's text part (a vision-language model's ``text_config``), else itself."""
    inner = cfg.get("text_config")
    return inner if isinstance(inner, dict) else cfg


def window(cfg: dict) -> Window:
    """The positions window of a model's (or a drafter's) ``config.json`` dict."""
    most = cfg.get("max_position_embeddings")
    most = int(most) if _number(most) else None
    scaling = rope_scaling(cfg)
    kind = str(scaling.get("rope_type") or scaling.get("type") or "default")
    factor, original = (
        _number(scaling.get("factor")),
        _number(
            scaling.get("original_max_position_embeddings")
            or cfg.get("original_max_position_embeddings")
        ),
    )
    positions = most
    if kind in STRETCHING and factor and factor > 1 and (original or most):
        positions = max(most or 0, int((original or most) * factor))
    types = cfg.get("layer_types") or []
    layers = cfg.get("num_hidden_layers")
    layers = int(layers) if _number(layers) else len(types)
    sliding = tuple(i for i, t in enumerate(types) if t == "sliding_attention")
    span = cfg.get("sliding_window")
    return Window(
        max_positions=most,
        rope_type=kind,
        factor=factor,
        original=int(original) if original else None,
        positions=positions,
        layers=layers,
        sliding=sliding if _number(span) else (),
        sliding_window=int(span) if _number(span) and sliding else None,
    )


def check(cfg: dict, longest: int, what: str = "drafter") -> str | None:
    """A warning line when `longest` tokens pass `cfg`'s window; None otherwise."""
    w = window(cfg)
    if w.reach is None or longest <= w.reach:
        return None
    return (
        f"the {what}'s window is {w.reach} positions ({w.describe()}) and this run's "
        f"contexts reach {longest} tokens: past {w.reach} it runs on positions it was not "
        "built for (see tau by context and its cliff in the result)"
    )
