"""The prompt sets an eval can be given: built-in ones (docs/eval.md) and a local JSONL file."""

from __future__ import annotations

import hashlib
import io
import json
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from orchestrator.errors import DflashError
from remote.protocol import SpecError, carried_name_problem, parse_prompts, prompt_lines

DATA_DIR = Path(__file__).resolve().parent.parent / "data"
PROMPTS_DIR = DATA_DIR / "prompts"

# Shipped once, composed by line: name -> (file's set, category or None for all), in order;
# the same bytes every time keep its content address and ground-truth cache stable.
COMPOSED_SETS: dict[str, tuple[tuple[str, str | None], ...]] = {
    "mt-bench": (("spec-bench", "mt_bench"),),
    "zlab": (
        ("gsm8k", None),
        ("math500", None),
        ("humaneval", None),
        ("mbpp", None),
        ("spec-bench", "mt_bench"),
    ),
}


@dataclass(frozen=True)
class PromptsData:
    """A prompts file as it travels to a host: its name, bytes and source (for the spec)."""

    name: str
    data: bytes
    source: str

    @cached_property
    def sha256(self) -> str:
        return hashlib.sha256(self.data).hexdigest()

    @property
    def carried_name(self) -> str:
        """Its content-addressed name on a host (`carried_prompts_name`)."""
        return carried_prompts_name(self.name, self.sha256)

    def entry(self, path: str) -> dict:
        """The job spec's ``prompts`` entry for it at `path` on the host."""
        count = sum(1 for line in self.data.splitlines() if line.strip())
        return {
            "path": path,
            "name": self.name,
            "sha256": self.sha256,
            "source": self.source,
            "count": count,
        }


def builtin_prompt_sets() -> dict[str, Path]:
    """Name -> file of the prompt sets shipped as files."""
    return {p.stem: p for p in sorted(PROMPTS_DIR.glob("*.jsonl"))}


def builtin_set_names() -> list[str]:
    """Every built-in set's name, files and composed sets together, sorted."""
    return sorted({*builtin_prompt_sets(), *COMPOSED_SETS})


def composed_set(name: str) -> bytes:
    """The bytes of composed set `name`: its parts' lines, unchanged, in order."""
    files = builtin_prompt_sets()
    lines = []
    for part, category in COMPOSED_SETS[name]:
        for line in files[part].read_text().splitlines():
            if line.strip() and (category is None or json.loads(line).get("category") == category):
                lines.append(line + "\n")
    return "".join(lines).encode()


def check_prompts(prompts: str) -> None:
    """Refuse in one line what `prompts_data` would, before anything connects."""
    if prompts not in COMPOSED_SETS:
        _local_file(prompts)


def prompts_data(prompts: str) -> PromptsData:
    """A built-in set by name, or a local JSONL file; one-line `DflashError` otherwise."""
    if prompts in COMPOSED_SETS:
        parts = " + ".join(
            f"{part}.jsonl" + (f" ({category})" if category else "")
            for part, category in COMPOSED_SETS[prompts]
        )
        return PromptsData(prompts, composed_set(prompts), f"built-in {prompts}: {parts}")
    local = _local_file(prompts)
    data = local.read_bytes()
    try:  # the host reads it by the same rules: refused here, before anything is sent
        parse_prompts(prompt_lines(io.BytesIO(data), str(local)), str(local), local.stem)
    except SpecError as exc:
        raise DflashError(str(exc)) from None
    return PromptsData(local.stem, data, str(local))


def _local_file(prompts: str) -> Path:
    """The file of a built-in file set or a local path, its name one the host accepts."""
    local = builtin_prompt_sets().get(prompts) or Path(prompts).expanduser()
    if not local.is_file():
        raise DflashError(
            f"prompts {prompts!r} is neither a built-in set "
            f"({', '.join(builtin_set_names())}) nor a local file; for a file on the host "
            "write host:/path"
        )
    why = carried_name_problem(carried_prompts_name(local.stem))
    if why:  # the host refuses it by the same rule
        raise DflashError(f"prompts file {str(local)!r}: its name {why}; rename it")
    return local


def carried_prompts_name(name: str, digest: str = "0" * 64) -> str:
    """A prompts file's content-addressed name on the host."""
    return f"{digest[:16]}-{name}.jsonl"
