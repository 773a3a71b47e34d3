"""Engine answers that cannot be true: a verdict, never a tau (docs/online.md)."""

from __future__ import annotations

from remote.errors import UserError

SPEC = "metrics.speculative_decoding"


class InvalidAnswer(UserError):
    """An impossible answer: `field` names what was wrong, the message is the one line."""

    def __init__(self, field: str, line: str):
        super().__init__(line)
        self.field = field

    def to_json(self) -> dict[str, str]:
        return {"field": self.field, "detail": str(self)}


def steps_fit(accepted: list[int], output_tokens: int, where: str) -> None:
    """Every verify step but the last must start inside the output."""
    after_first = output_tokens - 1
    emitted = 0
    for i, a in enumerate(accepted):
        if emitted >= after_first:
            raise InvalidAnswer(
                f"{SPEC}.per_step_accepted",
                f"{where} {SPEC}: {len(accepted)} verify steps accepting {sum(accepted)} "
                f"draft tokens for {output_tokens} output tokens is impossible (step {i} "
                "starts after the "
                f"output's last token: the first {i} steps already emit {emitted} tokens after "
                "the prefill's)",
            )
        emitted += a + 1


def totals_fit(steps: int, accepted: int, k: int, output_tokens: int, where: str) -> None:
    """`steps_fit` from totals: all steps but the last fit before the last token."""
    if steps and steps + accepted - (k + 1) >= output_tokens - 1:
        raise InvalidAnswer(
            f"{SPEC}.num_accepted_draft_tokens",
            f"{where} {SPEC}: {steps} verify steps accepting {accepted} draft tokens (at "
            f"most {k} a step) for {output_tokens} output tokens is impossible (they emit "
            f"{steps + accepted} tokens after the prefill's first)",
        )
