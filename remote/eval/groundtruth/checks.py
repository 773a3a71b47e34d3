"""What a ground truth must be before it is used or cached: a completion's ids (integers
inside the target's vocabulary, non-empty, at most ``max_new_tokens``), a ground-truth
file's records, a server's answer decoded greedily, retokenised text that can be what the
server generated."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from remote.errors import UserError
from remote.eval.groundtruth.prompts import read_jsonl
from remote.protocol import (
    ResultError,
    SpecError,
    completion_keys,
    is_int,
    sample_labels,
    sampling_mismatch,
)


def int_list(value: Any) -> bool:
    return isinstance(value, list) and all(is_int(v) for v in value)


def target_vocab_size(target: str, tokenizer) -> int:
    """How many token ids the target has: its (text) config's ``vocab_size`` (the rows of
    its embedding), else the tokenizer's length."""
    from remote.model.files import build_config

    try:
        vocab = build_config(Path(target)).get_text_config().vocab_size
    except (UserError, AttributeError):
        vocab = None
    return int(vocab) if isinstance(vocab, int) and vocab > 0 else len(tokenizer)


def check_completion(
    ids: Any, *, vocab: int, max_new: int | None, prompt_id: str, source: str, target: str
) -> list[int]:
    """`ids` if they can be the target's completion: a non-empty list of integer
    ids, each inside the vocabulary, at most `max_new` of them (None: any number, for
    retokenised text). Otherwise one UserError naming the source (a server URL, or the
    local generation) and the bad value."""
    if not int_list(ids):
        raise UserError(
            f"ground truth from {source} for prompt {prompt_id} is not a list of "
            "integer token ids; nothing was cached"
        )
    if not ids:
        raise UserError(
            f"ground truth from {source} for prompt {prompt_id} is empty (the "
            "target stopped at once); drop that prompt or check the server"
        )
    if max_new is not None and len(ids) > max_new:
        raise UserError(
            f"ground truth from {source} for prompt {prompt_id} has {len(ids)} "
            f"token ids, more than max_new_tokens {max_new}; nothing was cached"
        )
    bad = next((t for t in ids if not 0 <= t < vocab), None)
    if bad is not None:
        raise UserError(
            f"ground truth from {source} for prompt {prompt_id} holds token id "
            f"{bad}, outside the target's vocabulary (0..{vocab - 1}): it serves "
            f"another model or tokenizer than {target}; nothing was cached"
        )
    return ids


def read_ground_truth_file(path: str) -> list[dict]:
    """Validated ``{"id", "prompt_ids", "completion_ids"}`` records from a JSONL file."""
    out = []
    for n, obj in read_jsonl(path, "ground truth file"):
        if not (
            isinstance(obj, dict)
            and int_list(obj.get("prompt_ids"))
            and int_list(obj.get("completion_ids"))
            and obj["prompt_ids"]
        ):
            raise UserError(
                f'{path}:{n}: expected {{"id", "prompt_ids": [...], '
                '"completion_ids": [...]}} with token ids'
            )
        try:
            labels = {**sample_labels(obj), **completion_keys(obj)}
        except (ResultError, SpecError) as exc:
            raise UserError(f"{path}:{n}: {exc}") from None
        out.append(
            {
                "id": str(obj.get("id", n)),
                **labels,
                "prompt_ids": obj["prompt_ids"],
                "completion_ids": obj["completion_ids"],
            }
        )
    if not out:
        raise UserError(f"ground truth file {path} holds no records")
    return out


def reported_sampling(answer: Any) -> dict:
    """The sampling parameters a server's answer says it used, where it says any: keys
    ``temperature``, ``top_p``, ``top_k``, ``do_sample`` at the top, in SGLang's
    ``meta_info``, in an OpenAI ``choices[0]``, or in a ``sampling_params`` object of any of
    those. Empty when the answer reports nothing (most servers)."""
    found: dict = {}
    places = [answer] if isinstance(answer, dict) else []
    if places:
        places.append(answer.get("meta_info"))
        choices = answer.get("choices")
        if isinstance(choices, list) and choices:
            places.append(choices[0])
    for place in list(places):
        if isinstance(place, dict):
            places.append(place.get("sampling_params"))
    for place in places:
        if isinstance(place, dict):
            for key in ("temperature", "top_p", "top_k", "do_sample"):
                if key in place and key not in found:
                    found[key] = place[key]
    return found


def check_answer_sampling(answer: Any, url: str, sampling: dict) -> None:
    """Refuse an answer whose server reports it decoded otherwise than `sampling` (the
    completion's settings) asked: sampling when greedy was asked, another temperature,
    top-k or top-p; one line naming each."""
    differ = sampling_mismatch(reported_sampling(answer), sampling)
    if differ:
        shown = ", ".join(f"{k}={got} (asked {want})" for k, (got, want) in differ.items())
        raise UserError(
            f"ground truth server {url} reports other sampling than asked: {shown}; its "
            "answer is refused, since tau is measured against completions decoded as the "
            "engine decodes: serve the target without sampling overrides"
        )


def retokenisation_check(
    tokenizer,
    prompt_text: str,
    prompt_ids: list[int],
    completion_text: str,
    completion_ids: list[int],
    server_count: int | None = None,
) -> bool:
    """False when the retokenised ids cannot be what the server generated: the text holds
    U+FFFD (the server decoded a partial UTF-8 sequence: bytes were lost), the server
    counted another number of completion tokens, the ids do not decode back to the text,
    or encoding prompt and completion TOGETHER does not give the prompt's ids followed by
    the completion's (a merge across the boundary). Passing is necessary, not sufficient:
    a model may emit a non-canonical split of the same text, which only the eval's target
    agreement rate reveals."""
    if "\ufffd" in completion_text:
        return False
    if server_count is not None and server_count != len(completion_ids):
        return False
    if tokenizer.decode(completion_ids) != completion_text:
        return False
    joint = tokenizer(prompt_text + completion_text, add_special_tokens=False)["input_ids"]
    return list(joint) == list(prompt_ids) + list(completion_ids)
