"""The ground truth's source kinds as both sides know them, each written once (`GTKind`);
how a host asks each: `remote.eval.groundtruth`; in words: docs/eval.md."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SourceKind:
    """One source kind: `about` for ``--help``; `needs` ``url``, ``path`` or nothing;
    `reads_prompts` (a file is its own selection); `on_target`: made by the job's target."""

    name: str
    about: str
    needs: str | None = "url"
    reads_prompts: bool = True
    on_target: bool = False
    cached: bool = True

    @property
    def server(self) -> bool:
        return self.needs == "url"


class GTKind:
    """The source kinds; a URL with no kind is asked as the first server kind."""

    SGLANG = SourceKind("sglang", "SGLang's native /generate (token ids in and out)")
    OPENAI = SourceKind("openai", "an OpenAI-compatible /v1/completions returning token ids")
    OPENAI_TEXT = SourceKind("openai-text", "a text-only OpenAI-compatible server, retokenised")
    FILE = SourceKind(
        "file", "a JSONL file of token ids on the host", "path", reads_prompts=False, cached=False
    )
    LOCAL = SourceKind("local", "the target itself, on the eval host", None, on_target=True)


GT_SOURCES = {k.name: k for k in vars(GTKind).values() if isinstance(k, SourceKind)}
GT_KINDS = tuple(GT_SOURCES)
SERVER_KINDS = tuple(name for name, k in GT_SOURCES.items() if k.server)
DEFAULT_SERVER_KIND = SERVER_KINDS[0]


def kind_for(given: dict) -> SourceKind:
    """The kind of a ground truth naming none: the first needing what `given` names, else
    the kind that needs nothing."""
    return next(
        (k for k in GT_SOURCES.values() if k.needs and given.get(k.needs)),
        next(k for k in GT_SOURCES.values() if k.needs is None),
    )
