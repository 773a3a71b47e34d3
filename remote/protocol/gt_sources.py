"""Where a job's ground truth comes from, as both sides know it: each source kind once
(`GTKind`, `GT_SOURCES`), with what a job must name for it and what it does with the
job's prompts. How a host asks each kind is `remote.eval.groundtruth` (its `sources` and
`servers`); the kinds in words: docs/eval.md."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SourceKind:
    """One kind of ground-truth source: its `name` (``ground_truth_kind``), one line
    `about` it (for ``--help``), what a job names for it (`needs`: ``url``, a server;
    ``path``, a file on the host; None), whether it completes the job's prompts
    (`reads_prompts`; a file is its own selection), whether the job's target makes it on
    the host (`on_target`) and whether the host keeps what it makes in its ground-truth
    cache (`cached`)."""

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
    """The source kinds, each written once; the first server kind is the one a server URL
    is asked as when no kind is chosen."""

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
    """The kind of a ground truth that names none, from what it names (`given`: ``url``,
    ``path``): the first kind needing a given one (a URL: `DEFAULT_SERVER_KIND`), else the
    kind that needs nothing (the target makes it on the host)."""
    return next(
        (k for k in GT_SOURCES.values() if k.needs and given.get(k.needs)),
        next(k for k in GT_SOURCES.values() if k.needs is None),
    )
