"""What ``dflash parity`` compares: options, one dtype for both sides, layers, the two hosts."""

from __future__ import annotations

from dataclasses import dataclass, replace

from orchestrator.errors import DflashError
from orchestrator.eval.spec import EvalOptions, engine_spec
from orchestrator.inventory import HostSpec, Inventory
from remote.protocol import ATTN, CAPTURE_TOPK, JOB_ENGINE_DEFAULT, EvalSpec


@dataclass
class ParityOptions:
    """What to compare, the command line's options (docs/parity.md); ``layers`` None: the
    drafter's target layers, or all without a drafter."""

    model_a: str | None = None
    model_b: str | None = None
    prompts: str | None = None
    samples: int | None = None
    seed: int = 0
    max_new_tokens: int | None = None
    ground_truth: str | None = None
    ground_truth_kind: str | None = None
    ground_truth_timeout: float | None = None
    ground_truth_deadline: float | None = None
    ground_truth_phase_deadline: float | None = None
    fresh_ground_truth: bool = False
    drafter: str | None = None
    layers: list[int] | None = None
    dtype_a: str | None = None
    dtype_b: str | None = None
    device_a: str = "cpu"
    device_b: str = "cpu"
    attn_a: str | None = None
    attn_b: str | None = None
    topk: int = CAPTURE_TOPK
    threads: int | None = None
    dtype: str | None = None
    allow_different_targets: bool = False

    def __post_init__(self) -> None:
        a, b = self.engine("a")[0], self.engine("b")[0]
        self.device_a, self.device_b = a.device, b.device
        self.dtype_a = a.dtype if self.dtype_a is not None else None
        self.dtype_b = b.dtype if self.dtype_b is not None else None
        self.dtype = engine_spec(dtype=self.dtype)[0].dtype if self.dtype is not None else None
        for name in ("attn_a", "attn_b"):
            v = getattr(self, name)
            if v is not None and not ATTN(v):
                raise DflashError(ATTN.message("--" + name.replace("_", "-"), v))
        if self.layers is not None and (
            not self.layers or any(not isinstance(i, int) or i < 0 for i in self.layers)
        ):
            raise DflashError(f"--layers must be layer numbers from 0, got {self.layers!r}")
        if self.topk < 1:
            raise DflashError(f"--topk must be at least 1, got {self.topk}")
        self.eval_options()

    def engine(self, side: str) -> tuple[EvalSpec, frozenset[str]]:
        """Side `side`'s engine settings (dtype, device, threads) and which were given."""
        a = side == "a"
        return engine_spec(
            dtype=(self.dtype_a if a else self.dtype_b) or self.dtype,
            device=self.device_a if a else self.device_b,
            threads=self.threads,
        )

    def eval_options(self, side: str = "b") -> EvalOptions:
        engine, chosen = self.engine(side)
        return EvalOptions(
            prompts=self.prompts,
            samples=self.samples,
            seed=self.seed,
            max_new_tokens=self.max_new_tokens,
            temperature=0.0,  # greedy whatever the role's sampling: docs/parity.md
            ground_truth=self.ground_truth,
            ground_truth_kind=self.ground_truth_kind,
            ground_truth_timeout=self.ground_truth_timeout,
            ground_truth_deadline=self.ground_truth_deadline,
            ground_truth_phase_deadline=self.ground_truth_phase_deadline,
            fresh_ground_truth=self.fresh_ground_truth,
            target=self.model_a if side == "a" else self.model_b,
            engine=engine,
            chosen=chosen,
        )


def same_dtype(opts: ParityOptions, spec_b: HostSpec) -> ParityOptions:
    """`opts` with both sides' dtype chosen: a side's own, else ``dtype``, else B's inventory
    dtype, so each host's own inventory never silently makes them differ."""
    role = spec_b.eval
    base = opts.dtype or (role.dtype if role is not None else JOB_ENGINE_DEFAULT.dtype)
    return replace(opts, dtype_a=opts.dtype_a or base, dtype_b=opts.dtype_b or base)


def parse_layers(text: str | None) -> list[int] | None:
    """``"0,2,5"`` or ``"0-5"`` (or a mix) as a list; None stays None."""
    if not text:
        return None
    out: list[int] = []
    try:
        for part in text.split(","):
            part = part.strip()
            if "-" in part:
                lo, hi = part.split("-", 1)
                out += list(range(int(lo), int(hi) + 1))
            elif part:
                out.append(int(part))
    except ValueError:
        raise DflashError(f"--layers expects numbers like 0,2,5 or 0-5, got {text!r}") from None
    return out


@dataclass
class ParityRequest:
    """A parity run as `parity.run_parity` takes it: A the reference, B the comparing host."""

    inventory: Inventory
    host_a: str
    host_b: str
    options: ParityOptions


def parity_request(
    inventory: Inventory, hosts: str | None, options: ParityOptions
) -> ParityRequest:
    """The request for ``--hosts A,B``: exactly two hosts, else one line."""
    names = [n.strip() for n in (hosts or "").split(",") if n.strip()]
    if len(names) != 2:
        raise DflashError("--hosts needs exactly two hosts, A,B (A the reference, B compares)")
    return ParityRequest(inventory, names[0], names[1], options)
