"""The ground-truth servers: each kind one class (`Server`) saying how it is asked, what
its answer must hold and what it says it serves; `Server.make` is the phase with any of
them, through the host side's one HTTP client (`remote.httpclient.http_json`), up to
``concurrency`` requests in flight and the answers taken in prompt order (`in_order`)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any, ClassVar

from remote.errors import UserError
from remote.eval.groundtruth.cache import Emit
from remote.eval.groundtruth.checks import check_answer_sampling, int_list
from remote.eval.groundtruth.completions import Prompts, collect, require_source
from remote.httpclient import Redirected, Waits, answer_bytes, http_json, reachable
from remote.protocol import EvalSpec, GTKind, JobSpec, SourceKind

# One prompt as a server is asked for it: its text and its ids (the target's chat template).
Prompt = tuple[str, list[int]]


class Server:
    """How one server kind (`kind`, from the contract) is asked: at `path` under its base
    URL, with `request` for one prompt, its completion's sampling settings in the server's
    own words (`knobs`: the contract's name -> the server's; a setting that is off, None,
    is not sent); what its answer must hold
    (`completion`: the ids, unchecked, or for a `text` server the text and its token count)
    and the model it says it serves (`served`, part of the cache entry's key). A `warning`
    is recorded whenever it makes a ground truth."""

    kind: ClassVar[SourceKind]
    path: ClassVar[str]
    knobs: ClassVar[dict[str, str]]
    text: ClassVar[bool] = False
    warning: ClassVar[str | None] = None

    def request(self, prompt: Prompt, sampling: dict, model: str | None) -> dict:
        raise NotImplementedError

    def completion(self, answer: Any, endpoint: str, prompt: Prompt) -> Any:
        raise NotImplementedError

    def served(self, url: str, model: str | None, waits: Waits) -> dict:
        raise NotImplementedError

    def endpoint(self, url: str) -> str:
        """The request URL for a base URL, which may end with a leading part of `path`
        (``.../v1``) or all of it (a full endpoint URL is used as given)."""
        url, parts = url.rstrip("/"), self.path.split("/")
        for cut in range(len(parts) - 1, 0, -1):
            if url.endswith("/".join(parts[:cut])):
                return url + "/" + "/".join(parts[cut:])
        return url + self.path

    def wire(self, sampling: dict) -> dict:
        """A completion's sampling settings in this server's words (`knobs`)."""
        return {self.knobs[k]: v for k, v in sampling.items() if k in self.knobs and v is not None}

    def answer(self, url: str, model: str | None, prompt: Prompt, sampling: dict, waits: Waits):
        """The completion of one prompt: asked within `waits`' bounds, the answer bounded in
        size, its shape checked (`completion`) and its sampling what was asked."""
        endpoint = self.endpoint(url)
        answer = http_json(
            endpoint,
            self.request(prompt, sampling, model),
            waits.limits.timeout,
            deadline=waits.request(),
            waits=waits,
            max_bytes=answer_bytes(len(prompt[1]), sampling["max_new_tokens"]),
        )
        completion = self.completion(answer, endpoint, prompt)
        check_answer_sampling(answer, endpoint, sampling)
        return completion

    def make(
        self,
        job: JobSpec,
        engine: EvalSpec,
        waits: Waits,
        emit: Emit,
        *,
        load_model: Callable[[], Any] | None = None,
        asking: Callable[[], None] | None = None,
    ) -> tuple[str, dict]:
        """The server is reached and asked what it serves (who answers is part of what the
        ground truth is: another URL or served model is another cache entry), then, unless
        the cache holds the entry, asked for each prompt's completion (`asking` called
        first)."""
        gt = job.ground_truth
        prompts = Prompts.of(job, engine)
        require_source(job)
        if self.text and prompts.tokenizer is None:
            raise UserError(
                f"ground truth kind {self.kind.name} takes text prompts, and these are "
                "token ids: use a server that takes ids (sglang, openai) or local"
            )
        problem = reachable(gt.url, min(waits.limits.timeout, 10.0))
        if problem:
            raise UserError(problem)
        source = {"kind": gt.kind, "url": self.endpoint(gt.url)}
        source.update(self.served(gt.url, gt.model, waits))
        where = f"server {source['url']}" + (f" ({source['model']})" if source["model"] else "")
        hit = prompts.open_entry(source, where, self.text).cached(emit)
        if hit is not None:
            return hit
        if asking is not None:
            asking()
        if self.warning:
            prompts.warn(self.warning.format(url=gt.url), emit)
        model = source.get("model")
        asks = [
            (*ren, each) for ren, each in zip(prompts.rendered, prompts.requests(), strict=True)
        ]

        def ask(text: str, ids: list[int], sampling: dict) -> Any:
            # Only the request runs in the pool: tokenising, checking and emitting stay on
            # the phase's thread, in prompt order.
            return self.answer(gt.url, model, (text, ids), sampling, waits)

        answers = in_order(ask, asks, gt.concurrency)
        return prompts.store(collect(prompts, answers, waits, emit))


def _get(url: str, waits: Waits) -> Any:
    """A server's answer to ``GET url`` for what it serves; no answer (any failure but a
    refused redirect, `Redirected`) is None."""
    try:
        return http_json(
            url, None, min(waits.limits.timeout, 30.0), deadline=waits.request(), waits=waits
        )
    except Redirected:
        raise
    except UserError:
        return None


class SGLang(Server):
    """SGLang's native ``POST /generate``: ``input_ids`` in, ``output_ids`` out; it serves
    what ``GET /get_model_info`` calls ``model_path``."""

    kind = GTKind.SGLANG
    path = "/generate"
    knobs = {
        "temperature": "temperature",
        "max_new_tokens": "max_new_tokens",
        "top_k": "top_k",
        "top_p": "top_p",
        "seed": "sampling_seed",
    }

    def request(self, prompt: Prompt, sampling: dict, model: str | None) -> dict:
        return {"input_ids": prompt[1], "sampling_params": self.wire(sampling)}

    def completion(self, answer: Any, endpoint: str, prompt: Prompt) -> Any:
        if isinstance(answer, list) and len(answer) == 1:  # a batch of one
            answer = answer[0]
        ids = answer.get("output_ids") if isinstance(answer, dict) else None
        if not isinstance(ids, list):
            raise UserError(
                f"ground truth server {endpoint} answered without an 'output_ids' list of "
                "token ids; is it SGLang's native server?"
            )
        return ids

    def served(self, url: str, model: str | None, waits: Waits) -> dict:
        info = _get(self.endpoint(url)[: -len(self.path)] + "/get_model_info", waits)
        path = info.get("model_path") if isinstance(info, dict) else None
        return {"model": path if isinstance(path, str) and path else None}


class OpenAI(Server):
    """An OpenAI-compatible ``POST /v1/completions`` whose ``prompt`` is the token ids and
    which returns ids when asked (``return_token_ids``: vLLM >= 0.10.2, SGLang); it serves
    the model named (else the first ``GET /v1/models`` lists), the weights its ``root``."""

    kind = GTKind.OPENAI
    path = "/v1/completions"
    # top_k is vLLM's and SGLang's extension of the OpenAI API
    knobs = {
        "temperature": "temperature",
        "max_new_tokens": "max_tokens",
        "top_k": "top_k",
        "top_p": "top_p",
        "seed": "seed",
    }

    def request(self, prompt: Prompt, sampling: dict, model: str | None) -> dict:
        ask = {"prompt": prompt[1], **self.wire(sampling), "return_token_ids": True}
        return {"model": model, **ask} if model else ask

    def completion(self, answer: Any, endpoint: str, prompt: Prompt) -> Any:
        try:
            choice = answer["choices"][0]
        except (KeyError, IndexError, TypeError):
            raise UserError(
                f"ground truth server {endpoint} answered without 'choices'; is it an "
                "OpenAI-compatible completions endpoint?"
            ) from None
        ids = choice.get("token_ids") if isinstance(choice, dict) else None
        if not isinstance(ids, list):
            raise UserError(
                f"ground truth server {endpoint} returned no token ids (choices[0].token_ids);"
                " it needs return_token_ids support (vLLM >= 0.10.2, recent SGLang), "
                f"or use ground_truth_kind {OpenAIText.kind.name} (text only, retokenised)"
            )
        echoed = choice.get("prompt_token_ids", answer.get("prompt_token_ids"))
        if int_list(echoed) and echoed and echoed != prompt[1]:
            raise UserError(
                f"ground truth server {endpoint} tokenised the prompt differently "
                f"({len(echoed)} ids back for {len(prompt[1])} sent); it does not "
                "take token-id prompts as given"
            )
        return ids

    def served(self, url: str, model: str | None, waits: Waits) -> dict:
        listing = _get(self.endpoint(url).rsplit("/completions", 1)[0] + "/models", waits)
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


class OpenAIText(OpenAI):
    """A text-only OpenAI-compatible server (``transformers serve``, ...): the prompt's text
    in, ``choices[0].text`` out (with the server's own token count where it gives one),
    retokenised with the target's tokenizer and every sample checked, with a warning."""

    kind = GTKind.OPENAI_TEXT
    text = True
    warning = (
        "ground truth from a TEXT-only server ({url}): completions are retokenised with "
        "the target's tokenizer, which does not always give the ids the server generated; "
        "see the retokenisation mismatch rate"
    )

    def request(self, prompt: Prompt, sampling: dict, model: str | None) -> dict:
        ask = {"prompt": prompt[0], **self.wire(sampling)}
        return {"model": model, **ask} if model else ask

    def completion(self, answer: Any, endpoint: str, prompt: Prompt) -> Any:
        try:
            text = answer["choices"][0]["text"]
        except (KeyError, IndexError, TypeError):
            text = None
        if not isinstance(text, str):
            raise UserError(
                f"ground truth server {endpoint} answered without choices[0].text; is it "
                "an OpenAI-compatible completions endpoint?"
            )
        count = (answer.get("usage") or {}).get("completion_tokens")
        return text, count if isinstance(count, int) else None


# Every server kind this host can ask.
SERVERS = (SGLang(), OpenAI(), OpenAIText())


def in_order(ask: Callable[..., Any], rendered: list[tuple], concurrency: int) -> Iterator[Any]:
    """`ask(*request)` for every request (a rendered prompt: text, ids, and its sampling),
    yielded in prompt order. With
    `concurrency` > 1 up to that many requests are in flight at once (a serving engine
    batches them); the first failure in prompt order is raised, and requests not yet sent
    are dropped."""
    if concurrency <= 1 or len(rendered) <= 1:
        for request in rendered:
            yield ask(*request)
        return
    pool = ThreadPoolExecutor(
        max_workers=min(concurrency, len(rendered)), thread_name_prefix="ground-truth"
    )
    try:
        futures = [pool.submit(ask, *request) for request in rendered]
        for future in futures:
            yield future.result()
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
