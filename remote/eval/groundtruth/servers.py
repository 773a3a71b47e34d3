"""Asking a serving engine for greedy completions, through the host side's one HTTP client
(`remote.httpclient.http_json`): SGLang's native ``/generate``, an OpenAI-compatible
``/v1/completions`` with token ids or with text only, the model a server says it serves,
and up to ``concurrency`` requests in flight at once with the answers taken in prompt
order."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from remote.errors import UserError
from remote.eval.groundtruth.checks import check_answer_greedy, int_list
from remote.httpclient import Redirected, Waits, answer_bytes, http_json


def endpoint(url: str, kind: str) -> str:
    """The request URL for a base server URL (a full endpoint URL is used as given)."""
    url = url.rstrip("/")
    if kind == "sglang":
        return url if url.endswith("/generate") else url + "/generate"
    if url.endswith("/v1/completions"):
        return url
    return url + "/completions" if url.endswith("/v1") else url + "/v1/completions"


def _ask(url: str, payload: dict, prompt_tokens: int, sampling: dict, waits: Waits) -> Any:
    """One completion request within `waits`' bounds, its answer bounded in size."""
    return http_json(
        url,
        payload,
        waits.limits.timeout,
        deadline=waits.request(),
        waits=waits,
        max_bytes=answer_bytes(prompt_tokens, sampling["max_new_tokens"]),
    )


def sglang_generate(url: str, prompt_ids: list[int], sampling: dict, waits: Waits) -> Any:
    """SGLang's ``output_ids`` for one prompt, unchecked (see `check_completion`)."""
    ep = endpoint(url, "sglang")
    answer = _ask(
        ep,
        {
            "input_ids": prompt_ids,
            "sampling_params": {"temperature": 0.0, "max_new_tokens": sampling["max_new_tokens"]},
        },
        len(prompt_ids),
        sampling,
        waits,
    )
    if isinstance(answer, list) and len(answer) == 1:  # a batch of one
        answer = answer[0]
    ids = answer.get("output_ids") if isinstance(answer, dict) else None
    if not isinstance(ids, list):
        raise UserError(
            f"ground truth server {ep} answered without an 'output_ids' list of "
            "token ids; is it SGLang's native server?"
        )
    check_answer_greedy(answer, ep)
    return ids


def served_model(kind: str, url: str, model: str | None, waits: Waits) -> dict:
    """The model a server says it serves, for the cache key and the result's provenance:
    SGLang's ``GET /get_model_info`` ``model_path``; for OpenAI-compatible servers the name
    used (given, else the first ``GET /v1/models`` lists) and that entry's ``root`` (the
    weights' path, as vLLM and SGLang report it). A value the server does not report is
    None (the request then names no model and a single-model server uses its own). A
    redirect is refused here too (`Redirected`); any other failure counts as no answer."""

    def ask(path: str) -> Any:
        try:
            return http_json(
                path, None, min(waits.limits.timeout, 30.0), deadline=waits.request(), waits=waits
            )
        except Redirected:
            raise
        except UserError:
            return None

    if kind == "sglang":
        info = ask(endpoint(url, "sglang")[: -len("/generate")] + "/get_model_info")
        path = info.get("model_path") if isinstance(info, dict) else None
        return {"model": path if isinstance(path, str) and path else None}
    listing = ask(endpoint(url, "openai").rsplit("/completions", 1)[0] + "/models")
    entries = listing.get("data") if isinstance(listing, dict) else None
    entries = (
        [e for e in entries if isinstance(e, dict) and isinstance(e.get("id"), str)]
        if isinstance(entries, list)
        else []
    )
    name = model or (entries[0]["id"] if entries else None)
    entry = next((e for e in entries if e["id"] == name), {})
    root = entry.get("root")
    return {"model": name, "model_root": root if isinstance(root, str) and root else None}


def _with_model(payload: dict, model: str | None) -> dict:
    return {"model": model, **payload} if model else payload


def openai_completion_ids(
    url: str, model: str | None, prompt_ids: list[int], sampling: dict, waits: Waits
) -> Any:
    """``choices[0].token_ids`` for one prompt, unchecked (see `check_completion`)."""
    ep = endpoint(url, "openai")
    answer = _ask(
        ep,
        _with_model(
            {
                "prompt": prompt_ids,
                "max_tokens": sampling["max_new_tokens"],
                "temperature": 0.0,
                "return_token_ids": True,
            },
            model,
        ),
        len(prompt_ids),
        sampling,
        waits,
    )
    try:
        choice = answer["choices"][0]
    except (KeyError, IndexError, TypeError):
        raise UserError(
            f"ground truth server {ep} answered without 'choices'; is it an "
            "OpenAI-compatible completions endpoint?"
        ) from None
    ids = choice.get("token_ids") if isinstance(choice, dict) else None
    if not isinstance(ids, list):
        raise UserError(
            f"ground truth server {ep} returned no token ids (choices[0].token_ids);"
            " it needs return_token_ids support (vLLM >= 0.10.2, recent SGLang), "
            "or use ground_truth_kind openai-text (text only, retokenised)"
        )
    check_answer_greedy(answer, ep)
    echoed = choice.get("prompt_token_ids", answer.get("prompt_token_ids"))
    if int_list(echoed) and echoed and echoed != prompt_ids:
        raise UserError(
            f"ground truth server {ep} tokenised the prompt differently "
            f"({len(echoed)} ids back for {len(prompt_ids)} sent); it does not "
            "take token-id prompts as given"
        )
    return ids


def openai_completion_text(
    url: str, model: str | None, prompt_text: str, sampling: dict, waits: Waits, prompt_tokens: int
) -> tuple[str, int | None]:
    """(completion text, the server's own count of completion tokens if it reports one);
    `prompt_tokens`: the prompt's length in the target's ids (for the answer's bound)."""
    ep = endpoint(url, "openai")
    answer = _ask(
        ep,
        _with_model(
            {"prompt": prompt_text, "max_tokens": sampling["max_new_tokens"], "temperature": 0.0},
            model,
        ),
        prompt_tokens,
        sampling,
        waits,
    )
    try:
        text = answer["choices"][0]["text"]
    except (KeyError, IndexError, TypeError):
        text = None
    if not isinstance(text, str):
        raise UserError(
            f"ground truth server {ep} answered without choices[0].text; is it "
            "an OpenAI-compatible completions endpoint?"
        )
    check_answer_greedy(answer, ep)
    count = (answer.get("usage") or {}).get("completion_tokens")
    return text, count if isinstance(count, int) else None


def in_order(
    ask: Callable[[str, list[int]], Any], rendered: list[tuple[str, list[int]]], concurrency: int
) -> Iterator[Any]:
    """`ask(text, ids)` for every rendered prompt, yielded in prompt order. With
    `concurrency` > 1 up to that many requests are in flight at once (a serving engine
    batches them); the first failure in prompt order is raised, and requests not yet sent
    are dropped."""
    if concurrency <= 1 or len(rendered) <= 1:
        for text, ids in rendered:
            yield ask(text, ids)
        return
    pool = ThreadPoolExecutor(
        max_workers=min(concurrency, len(rendered)), thread_name_prefix="ground-truth"
    )
    try:
        futures = [pool.submit(ask, text, ids) for text, ids in rendered]
        for future in futures:
            yield future.result()
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
