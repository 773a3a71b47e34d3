"""A serving engine's answer that reads as the engine's format but cannot be true: counts
that do not fit the tokens it returned, totals that disagree with their own parts,
counters that are negative, go backwards or do not move while requests are answered.
Such an answer is not a measurement: the verdict is ``engine_answer_invalid`` (one line
naming the field), never a tau. A malformed answer (a missing field, a wrong type) is a
`UserError` instead: nothing can be read from it at all. Stdlib only."""

from __future__ import annotations

from remote.errors import UserError

SPEC = "metrics.speculative_decoding"  # where vLLM's answer carries its acceptance


class InvalidAnswer(UserError):
    """An impossible answer: `field` names what was wrong, the message is the one line."""

    def __init__(self, field: str, line: str):
        super().__init__(line)
        self.field = field

    def to_json(self) -> dict[str, str]:
        return {"field": self.field, "detail": str(self)}


def steps_fit(accepted: list[int], output_tokens: int, where: str) -> None:
    """Verify steps that accepted ``accepted[i]`` draft tokens each emit ``a + 1`` tokens
    after the prefill's first; an engine stops once the output is complete, so every step
    but the last starts inside it. A step that starts after the output ended (15 steps of
    3 accepted for 16 tokens) is `InvalidAnswer`."""
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
    """`steps_fit` from totals alone (no per-step arrays): the steps emit ``steps +
    accepted`` tokens, the last at most ``k + 1`` of them, so the others at least the rest;
    those must fit before the output's last token."""
    if steps and steps + accepted - (k + 1) >= output_tokens - 1:
        raise InvalidAnswer(
            f"{SPEC}.num_accepted_draft_tokens",
            f"{where} {SPEC}: {steps} verify steps accepting {accepted} draft tokens (at "
            f"most {k} a step) for {output_tokens} output tokens is impossible (they emit "
            f"{steps + accepted} tokens after the prefill's first)",
        )
