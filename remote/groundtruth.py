"""Ground truth for the offline walk: each prompt's GREEDY completion by the target, as ids.

Runs on the eval host, as a job's first phase, because the serving engine usually listens
on the host's own loopback. Sources (``spec["ground_truth"]["kind"]``):

- ``sglang``: SGLang's native ``POST /generate`` with ``input_ids`` and
  ``sampling_params {temperature: 0, max_new_tokens}``; the answer's ``output_ids``.
- ``openai``: an OpenAI-compatible ``POST /v1/completions`` whose ``prompt`` is the list of
  token ids and which returns ids when asked (``return_token_ids: true``, as vLLM >= 0.10.2
  and SGLang offer): ``choices[0].token_ids``.
- ``openai-text``: a text-only OpenAI-compatible server (``transformers serve``, ...). Text
  is not ids: decode-then-encode does not always round-trip. Accepted with a loud warning;
  the completion is retokenised with the target's tokenizer and every sample is checked
  (see `retokenisation_check`); the mismatch rate is recorded with the result.
- ``file``: a JSONL file already holding ``{"id", "prompt_ids", "completion_ids"}`` lines.
- ``local``: greedy generation on this host with the target itself (slow for big models).

Prompts are JSONL, z-lab's ``{"turns": [...]}`` (the first turn is the user message) or
``{"prompt": "..."}``; the target's chat template is applied (``thinking`` on or off).
``samples`` picks that many prompts with a seeded RNG, in file order.

The result is cached in ``<workdir>/groundtruth/<key>.jsonl`` where ``key`` hashes the
target's identity (its path, config and weight files' sizes), the exact prompt ids (so
the prompt file, the selection, the template and the thinking flag are all in it), the
sampling parameters and the kind of source: the next checkpoint evaluated against the same
prompts reuses it. Only greedy decoding is accepted: a ground truth sampled at temperature
> 0 is not what speculative decoding with greedy verification reproduces.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import socket
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any, Callable, Iterator

from remote.errors import UserError

KINDS = ("sglang", "openai", "openai-text", "file", "local")
DEFAULT_TIMEOUT = 300.0
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")

Emit = Callable[..., None]


# ---- prompts ----------------------------------------------------------------------------

def read_jsonl(path: str, what: str) -> Iterator[tuple[int, Any]]:
    """(line number, parsed value) for each non-blank line; one-line UserErrors otherwise."""
    try:
        lines = Path(path).read_text().splitlines()
    except OSError as exc:
        raise UserError(f"cannot read {what} {path}: {exc.strerror or exc}")
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            yield n, json.loads(line)
        except ValueError:
            raise UserError(f"{path}:{n}: not valid JSON") from None


def load_prompts(path: str, samples: int | None = None, seed: int = 0) -> list[dict]:
    """Prompt records ``{"id", "text"}`` from a JSONL file, optionally a seeded subset."""
    records = []
    stem = Path(path).stem
    for n, obj in read_jsonl(path, "prompts file"):
        if isinstance(obj, dict) and isinstance(obj.get("turns"), list) and obj["turns"] \
                and isinstance(obj["turns"][0], str):
            text = obj["turns"][0]
        elif isinstance(obj, dict) and isinstance(obj.get("prompt"), str):
            text = obj["prompt"]
        else:
            raise UserError(f"{path}:{n}: expected {{\"turns\": [\"...\"]}} or "
                            "{\"prompt\": \"...\"}")
        records.append({"id": str(obj.get("id", f"{stem}-{len(records)}")), "text": text})
    if not records:
        raise UserError(f"prompts file {path} holds no prompts")
    return select(records, samples, seed)


def select(records: list, samples: int | None, seed: int) -> list:
    """`samples` records chosen with a fixed seed, kept in their original order."""
    if samples is None or samples >= len(records):
        return list(records)
    if samples < 1:
        raise UserError(f"--samples must be at least 1, got {samples}")
    keep = sorted(random.Random(seed).sample(range(len(records)), samples))
    return [records[i] for i in keep]


def load_tokenizer(target: str):
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(target)
    except Exception as exc:
        raise UserError(f"cannot load the target's tokenizer from {target}: "
                        f"{str(exc).splitlines()[0] if str(exc) else type(exc).__name__}")


def render_prompt(tokenizer, text: str, thinking: bool) -> tuple[str, list[int]]:
    """(prompt text, prompt ids) with the chat template applied, generation prompt added."""
    if getattr(tokenizer, "chat_template", None):
        rendered = tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True,
            enable_thinking=thinking)
    else:
        rendered = text
    ids = tokenizer(rendered, add_special_tokens=False)["input_ids"]
    return rendered, list(ids)


# ---- identity and cache -----------------------------------------------------------------

def target_identity(target: str) -> dict:
    """What identifies a target without reading its weights: path, config hash, files."""
    root = Path(target)
    config = root / "config.json"
    try:
        config_hash = hashlib.sha256(config.read_bytes()).hexdigest()
    except OSError:
        raise UserError(f"no config.json in target folder {target}")
    files = sorted((p.name, p.stat().st_size) for p in root.iterdir()
                   if p.suffix in WEIGHT_SUFFIXES)
    return {"path": str(root.resolve()), "config_sha256": config_hash, "weights": files}


def cache_key(identity: dict, prompt_ids: list[list[int]], sampling: dict, kind: str) -> str:
    h = hashlib.sha256()
    h.update(json.dumps({"target": identity, "sampling": sampling, "kind": kind},
                        sort_keys=True).encode())
    for ids in prompt_ids:
        h.update(json.dumps(ids).encode() + b"\n")
    return h.hexdigest()[:24]


def check_greedy(sampling: dict) -> dict:
    """The sampling parameters, normalised; anything but greedy decoding is refused."""
    temperature = float(sampling.get("temperature", 0.0))
    top_k = sampling.get("top_k")
    top_p = sampling.get("top_p")
    if temperature != 0.0 or (top_p not in (None, 1, 1.0)) or (top_k not in (None, -1, 0, 1)):
        raise UserError(f"ground truth must be greedy (temperature 0); got temperature="
                        f"{temperature}, top_p={top_p}, top_k={top_k}. Acceptance under "
                        "greedy verification is only defined against greedy completions")
    max_new = int(sampling.get("max_new_tokens", 256))
    if max_new < 1:
        raise UserError(f"max_new_tokens must be at least 1, got {max_new}")
    return {"temperature": 0.0, "max_new_tokens": max_new}


# ---- HTTP -------------------------------------------------------------------------------

def endpoint(url: str, kind: str) -> str:
    """The request URL for a base server URL (a full endpoint URL is used as given)."""
    url = url.rstrip("/")
    if kind == "sglang":
        return url if url.endswith("/generate") else url + "/generate"
    if url.endswith("/v1/completions"):
        return url
    return url + "/completions" if url.endswith("/v1") else url + "/v1/completions"


def http_json(url: str, payload: dict | None, timeout: float) -> Any:
    """POST (or GET when `payload` is None) JSON; every failure is one clear UserError."""
    data = None if payload is None else json.dumps(payload).encode()
    req = urllib.request.Request(url, data=data, method="GET" if data is None else "POST",
                                 headers={"Content-Type": "application/json",
                                          "Accept": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            body = resp.read()
    except urllib.error.HTTPError as exc:
        detail = exc.read()[:300].decode(errors="replace").strip().replace("\n", " ")
        raise UserError(f"ground truth server {url} answered HTTP {exc.code} "
                        f"{exc.reason}{': ' + detail if detail else ''}")
    except urllib.error.URLError as exc:
        reason = exc.reason
        if isinstance(reason, (socket.timeout, TimeoutError)):
            raise UserError(f"ground truth server {url} did not answer within {timeout:g}s "
                            "(timed out)")
        if isinstance(reason, ConnectionRefusedError):
            raise UserError(f"ground truth server {url} refused the connection; is it "
                            "running and listening there (from the eval host's view)?")
        raise UserError(f"ground truth server {url} is unreachable: {reason}")
    except (socket.timeout, TimeoutError):
        raise UserError(f"ground truth server {url} did not answer within {timeout:g}s "
                        "(timed out)")
    except (ConnectionError, OSError) as exc:
        raise UserError(f"ground truth server {url} dropped the connection: {exc}")
    try:
        return json.loads(body)
    except ValueError:
        snippet = body[:80].decode(errors="replace").replace("\n", " ")
        raise UserError(f"ground truth server {url} returned malformed JSON: {snippet!r}")


def reachable(url: str, timeout: float = 5.0) -> str | None:
    """None when something accepts TCP connections at the URL's host and port, else why."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return f"ground truth URL {url!r} is not an http(s) URL"
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        with socket.create_connection((parts.hostname, port), timeout=timeout):
            return None
    except ConnectionRefusedError:
        return (f"ground truth server {url} refused the connection from this host; is it "
                "running?")
    except (socket.timeout, TimeoutError):
        return f"ground truth server {url} did not accept a connection within {timeout:g}s"
    except OSError as exc:
        return f"ground truth server {url} is unreachable from this host: {exc.strerror or exc}"


def _int_list(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool)
                                           for v in value)


def sglang_generate(url: str, prompt_ids: list[int], sampling: dict, timeout: float) -> list[int]:
    answer = http_json(endpoint(url, "sglang"), {
        "input_ids": prompt_ids,
        "sampling_params": {"temperature": 0.0, "max_new_tokens": sampling["max_new_tokens"]},
    }, timeout)
    if isinstance(answer, list) and len(answer) == 1:  # a batch of one
        answer = answer[0]
    ids = answer.get("output_ids") if isinstance(answer, dict) else None
    if not _int_list(ids):
        raise UserError(f"ground truth server {endpoint(url, 'sglang')} answered without an "
                        "'output_ids' list of token ids; is it SGLang's native server?")
    return ids


def openai_model_name(url: str, model: str | None, timeout: float) -> str | None:
    """The served model name: given, else the first one /v1/models lists, else None (the
    request then names no model and a single-model server uses its own)."""
    if model:
        return model
    base = endpoint(url, "openai").rsplit("/completions", 1)[0]
    try:
        listing = http_json(base + "/models", None, min(timeout, 30.0))
        return str(listing["data"][0]["id"])
    except (UserError, KeyError, IndexError, TypeError):
        return None


def _with_model(payload: dict, model: str | None) -> dict:
    return {"model": model, **payload} if model else payload


def openai_completion_ids(url: str, model: str | None, prompt_ids: list[int], sampling: dict,
                          timeout: float) -> list[int]:
    ep = endpoint(url, "openai")
    answer = http_json(ep, _with_model({"prompt": prompt_ids,
                                        "max_tokens": sampling["max_new_tokens"],
                                        "temperature": 0.0, "return_token_ids": True}, model),
                       timeout)
    try:
        choice = answer["choices"][0]
    except (KeyError, IndexError, TypeError):
        raise UserError(f"ground truth server {ep} answered without 'choices'; is it an "
                        "OpenAI-compatible completions endpoint?")
    ids = choice.get("token_ids") if isinstance(choice, dict) else None
    if not _int_list(ids):
        raise UserError(f"ground truth server {ep} returned no token ids (choices[0].token_ids);"
                        " it needs return_token_ids support (vLLM >= 0.10.2, recent SGLang), "
                        "or use ground_truth_kind openai-text (text only, retokenised)")
    echoed = choice.get("prompt_token_ids", answer.get("prompt_token_ids"))
    if _int_list(echoed) and echoed and echoed != prompt_ids:
        raise UserError(f"ground truth server {ep} tokenised the prompt differently "
                        f"({len(echoed)} ids back for {len(prompt_ids)} sent); it does not "
                        "take token-id prompts as given")
    return ids


def openai_completion_text(url: str, model: str | None, prompt_text: str, sampling: dict,
                           timeout: float) -> tuple[str, int | None]:
    """(completion text, the server's own count of completion tokens if it reports one)."""
    ep = endpoint(url, "openai")
    answer = http_json(ep, _with_model({"prompt": prompt_text,
                                        "max_tokens": sampling["max_new_tokens"],
                                        "temperature": 0.0}, model), timeout)
    try:
        text = answer["choices"][0]["text"]
    except (KeyError, IndexError, TypeError):
        text = None
    if not isinstance(text, str):
        raise UserError(f"ground truth server {ep} answered without choices[0].text; is it "
                        "an OpenAI-compatible completions endpoint?")
    count = (answer.get("usage") or {}).get("completion_tokens")
    return text, count if isinstance(count, int) else None


def retokenisation_check(tokenizer, prompt_text: str, prompt_ids: list[int],
                         completion_text: str, completion_ids: list[int],
                         server_count: int | None = None) -> bool:
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


# ---- local greedy -----------------------------------------------------------------------

class LocalGenerator:
    """Greedy generation with the target on this host (transformers, KV cache)."""

    def __init__(self, target: str, dtype: str, threads: int | None):
        import torch
        from transformers import AutoModelForCausalLM

        if threads:
            torch.set_num_threads(int(threads))
        try:
            self.model = AutoModelForCausalLM.from_pretrained(
                target, dtype=getattr(torch, dtype))
        except Exception as exc:
            raise UserError(f"cannot load the target {target} for local generation: "
                            f"{str(exc).splitlines()[0] if str(exc) else type(exc).__name__}")
        self.model.eval()
        self.torch = torch

    def generate(self, prompt_ids: list[int], sampling: dict) -> list[int]:
        torch = self.torch
        with torch.inference_mode():
            out = self.model.generate(torch.tensor([prompt_ids]), do_sample=False,
                                      max_new_tokens=sampling["max_new_tokens"],
                                      attention_mask=torch.ones(1, len(prompt_ids),
                                                                dtype=torch.long))
        return out[0, len(prompt_ids):].tolist()


# ---- the phase --------------------------------------------------------------------------

def read_ground_truth_file(path: str) -> list[dict]:
    """Validated ``{"id", "prompt_ids", "completion_ids"}`` records from a JSONL file."""
    out = []
    for n, obj in read_jsonl(path, "ground truth file"):
        if not (isinstance(obj, dict) and _int_list(obj.get("prompt_ids"))
                and _int_list(obj.get("completion_ids")) and obj["prompt_ids"]):
            raise UserError(f"{path}:{n}: expected {{\"id\", \"prompt_ids\": [...], "
                            "\"completion_ids\": [...]}} with token ids")
        out.append({"id": str(obj.get("id", n)), "prompt_ids": obj["prompt_ids"],
                    "completion_ids": obj["completion_ids"]})
    if not out:
        raise UserError(f"ground truth file {path} holds no records")
    return out


def write_jsonl_atomic(path: Path, records: list[dict]) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "w") as fh:
        for r in records:
            fh.write(json.dumps(r) + "\n")
    os.replace(tmp, path)


def prepare(spec: dict, emit: Emit = lambda *a, **k: None) -> tuple[str, dict]:
    """Make (or reuse) the ground truth the job asks for.

    Returns (path of a JSONL file of ``{"id", "prompt_ids", "completion_ids"}``, info for
    the result: kind, url, cache key, whether it was cached, warnings, retokenisation).
    """
    gt = dict(spec.get("ground_truth") or {})
    kind = gt.get("kind", "sglang")
    if kind not in KINDS:
        raise UserError(f"unknown ground truth kind {kind!r} (one of {', '.join(KINDS)})")
    sampling = check_greedy(spec.get("sampling") or {})
    timeout = float(gt.get("timeout", DEFAULT_TIMEOUT))
    workdir = Path(os.path.expanduser(spec.get("workdir", "~/.dflash")))
    info: dict[str, Any] = {"kind": kind, "url": gt.get("url"), "path": gt.get("path"),
                            "sampling": sampling, "warnings": []}

    if kind == "file":
        if not gt.get("path"):
            raise UserError("ground truth kind 'file' needs a path")
        records = select(read_ground_truth_file(gt["path"]), spec.get("samples"),
                         int(spec.get("seed", 0)))
        # The selection belongs to this job: keep it in the job's folder.
        out = workdir / "jobs" / str(spec.get("job_id", "adhoc")) / "ground_truth.jsonl"
        out.parent.mkdir(parents=True, exist_ok=True)
        write_jsonl_atomic(out, records)
        info.update(cached=False, samples=len(records), file=str(out))
        emit("ground_truth", done=len(records), total=len(records), cached=False)
        return str(out), info

    target = spec["target"]
    tokenizer = load_tokenizer(target)
    thinking = bool(spec.get("thinking", False))
    prompts = load_prompts(spec["prompts"]["path"], spec.get("samples"), int(spec.get("seed", 0)))
    rendered = [render_prompt(tokenizer, p["text"], thinking) for p in prompts]
    key = cache_key(target_identity(target), [ids for _, ids in rendered], sampling, kind)
    cache_dir = workdir / "groundtruth"
    cache_dir.mkdir(parents=True, exist_ok=True)
    path, meta_path = cache_dir / f"{key}.jsonl", cache_dir / f"{key}.json"
    info.update(cache_key=key, file=str(path), thinking=thinking, samples=len(prompts))
    if path.is_file() and meta_path.is_file():
        meta = json.loads(meta_path.read_text())
        info.update(cached=True, warnings=meta.get("warnings", []),
                    retokenisation=meta.get("retokenisation"), generated=meta.get("generated"))
        for w in info["warnings"]:
            emit("warning", message=w)
        emit("ground_truth", done=len(prompts), total=len(prompts), cached=True)
        return str(path), info

    if kind in ("sglang", "openai", "openai-text"):
        if not gt.get("url"):
            raise UserError(f"ground truth kind {kind!r} needs a server URL")
        problem = reachable(gt["url"], min(timeout, 10.0))
        if problem:
            raise UserError(problem)
    if kind == "openai-text":
        warning = (f"ground truth from a TEXT-only server ({gt['url']}): completions are "
                   "retokenised with the target's tokenizer, which does not always give the "
                   "ids the server generated; see the retokenisation mismatch rate")
        info["warnings"].append(warning)
        emit("warning", message=warning)

    generator = None
    model_name = None
    if kind == "local":
        generator = LocalGenerator(target, spec.get("dtype", "bfloat16"), spec.get("threads"))
    elif kind in ("openai", "openai-text"):
        model_name = openai_model_name(gt["url"], gt.get("model"), timeout)
        info["model"] = model_name
    records = []
    mismatched = 0
    started = time.time()
    for i, (prompt, (text, ids)) in enumerate(zip(prompts, rendered)):
        if kind == "sglang":
            completion = sglang_generate(gt["url"], ids, sampling, timeout)
        elif kind == "openai":
            completion = openai_completion_ids(gt["url"], model_name, ids, sampling, timeout)
        elif kind == "openai-text":
            ctext, count = openai_completion_text(gt["url"], model_name, text, sampling,
                                                  timeout)
            completion = list(tokenizer(ctext, add_special_tokens=False)["input_ids"])
            if not retokenisation_check(tokenizer, text, ids, ctext, completion, count):
                mismatched += 1
        else:
            completion = generator.generate(ids, sampling)
        if not completion:
            raise UserError(f"ground truth for prompt {prompt['id']} is empty (the target "
                            "stopped at once); drop that prompt or check the server")
        records.append({"id": prompt["id"], "prompt_ids": ids, "completion_ids": completion})
        emit("ground_truth", done=i + 1, total=len(prompts), cached=False,
             tokens=len(completion))
    if kind == "openai-text":
        info["retokenisation"] = {
            "samples": len(records), "mismatched": mismatched,
            "mismatch_rate": mismatched / len(records),
            "check": "no U+FFFD in the text, server's token count matches, ids decode to the "
                     "text, prompt+completion encodes to prompt ids + completion ids; a lower "
                     "bound: compare the target agreement rate"}
        if mismatched:
            warning = (f"retokenisation mismatch in {mismatched} of {len(records)} samples "
                       f"({mismatched / len(records):.0%}): their ground-truth ids may differ "
                       "from what the server generated")
            info["warnings"].append(warning)
            emit("warning", message=warning)
    info.update(cached=False, generated=time.time(), seconds=round(time.time() - started, 3))
    write_jsonl_atomic(path, records)
    meta = {k: info[k] for k in ("kind", "url", "model", "sampling", "thinking", "samples",
                                 "warnings", "retokenisation", "generated") if k in info}
    meta["target"] = target_identity(target)
    meta_tmp = meta_path.with_name(f".{meta_path.name}.tmp-{os.getpid()}")
    meta_tmp.write_text(json.dumps(meta, indent=2))
    os.replace(meta_tmp, meta_path)
    return str(path), info
