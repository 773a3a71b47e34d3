"""The eval engine's view of a target: its text part, loaded by `remote.model`, and one
forward per sequence that returns the hooked decoder-layer outputs and greedy tokens.

Hidden states come from forward hooks on the backbone's decoder layers (raw layer outputs,
even for the last layer, whose ``output_hidden_states`` entry is final-normed), keeping only
the layers the drafter needs. The backbone is always called directly, never the wrapper, so
a VLM's vision tower is never built or run.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from remote.errors import UserError
from remote.eval import linear_attention
from remote.model.files import one_line
from remote.model.layout import TextLayout, text_weight_bytes  # noqa: F401 (re-exported)
from remote.model.layout import describe as describe_model
from remote.model.load import load_text

TargetInfo = TextLayout  # what the engine reports about a target


def first_row(out) -> torch.Tensor:
    """A decoder layer's output for the one sequence, [T, hidden].

    Layers return a tensor or a tuple whose first item is the hidden state, [batch, T, H];
    a layer that carries parallel streams (Gemma3n's AltUp: [streams, batch, T, H]) gives
    its first stream, the active one the model predicts and corrects.
    """
    t = out[0] if isinstance(out, (tuple, list)) else out
    while t.dim() > 2:
        t = t[0]
    return t


def greedy_tokens(logits: torch.Tensor) -> torch.Tensor:
    """Argmax over the last axis, in the logits' own dtype: ``max``'s indices (the first
    maximum, as ``argmax``'s) come several times faster on a CPU than ``argmax``, and
    without a float32 copy (exact: bf16 values and ties are kept by the cast)."""
    return logits.max(dim=-1).indices


class Target:
    """The text part of a target model, ready for one forward per sequence.

    ``embed`` and ``lm_head`` are weight matrices [vocab, hidden] (the drafter borrows them).
    ``whole`` is False for a target loaded with ``ends_only`` (its embedding and head
    alone): it cannot run a forward, and says so. ``linear_attention``: which kernels its
    linear-attention layers run (`remote.eval.linear_attention.kind`; None: it has none).
    """

    def __init__(
        self,
        model: nn.Module,
        info: TextLayout,
        dtype: torch.dtype,
        whole: bool = True,
        folder: str | None = None,
    ):
        self.info = info
        self.dtype = dtype
        self.folder = folder
        self._bind(model, whole)

    def _bind(self, model: nn.Module, whole: bool) -> None:
        self.model = model  # full tree; only backbone + head are materialised
        self.whole = whole
        info = self.info
        self.backbone = model.get_submodule(info.backbone_path) if info.backbone_path else model
        self.layers = model.get_submodule(info.layers_path)
        self.head = model.get_submodule(info.head_path)
        self.embedding = model.get_submodule(info.embed_path)
        # linear-attention layers run this engine's CPU kernels (`remote.eval.linear_attention`)
        self.linear_attention = linear_attention.install(self.backbone) if whole else None

    def load_layers(self) -> None:
        """Load the whole text part in place of a target that is not ``whole`` (an eval
        whose cached features turned out not all usable: it needs the target's forward)."""
        if not self.whole:
            self._bind(load_text(self.folder, self.dtype).model, True)

    @property
    def embed(self) -> torch.Tensor:
        return self.embedding.weight

    @property
    def lm_head(self) -> torch.Tensor:
        return self.head.weight

    @torch.inference_mode()
    def forward(
        self,
        ids: list[int] | torch.Tensor,
        layer_ids: list[int],
        argmax_from: int = 0,
        chunk: int = 256,
        cache=None,
        final: bool = False,
    ) -> tuple[torch.Tensor, ...]:
        """One forward over ``ids``. Returns (features [T, len(layer_ids)*hidden] = raw outputs
        of the named decoder layers concatenated in order, greedy argmax [T - argmax_from] of
        the head at positions ``argmax_from..T-1``) and with `final` the final (normed)
        hidden rows the head read there. The head runs in chunks of positions so a large
        vocabulary never materialises [T, vocab] logits. The argmax is `greedy_tokens`.
        ``cache``: an empty transformers cache the forward fills (the same numbers)."""
        feats, last = self.hidden(ids, layer_ids, cache)
        arg = []
        for a in range(argmax_from, last.shape[0], chunk):
            arg.append(greedy_tokens(self.head(last[a : a + chunk])))
        greedy = torch.cat(arg) if arg else torch.zeros(0, dtype=torch.long)
        if final:  # the rows the head read: a sampled eval's target distributions
            return feats, greedy, last[argmax_from:].clone()
        return feats, greedy

    @torch.inference_mode()
    def hidden(
        self, ids: list[int] | torch.Tensor, layer_ids: list[int], cache=None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The backbone's pass of `forward`: (features [T, len(layer_ids)*hidden], the final
        (normed) hidden state [T, hidden] that the head reads); ``cache`` as `forward`'s."""
        if not self.whole:  # the caller loads the whole target first (a cache miss)
            raise RuntimeError("a target loaded without its layers cannot run a forward")
        ids_t = torch.as_tensor(ids, dtype=torch.long, device=self.embed.device)[None]
        # Each hooked layer's output is copied into its columns as it comes (the layer's
        # own tensor is then freed with the forward's): the features are held once, not
        # as the layers' outputs and then their concatenation.
        h, feats = self.info.hidden_size, None
        hooks = []
        for i in sorted(set(layer_ids)):

            def hook(_m, _args, out, i=i):
                nonlocal feats
                row = first_row(out)
                if feats is None:
                    feats = row.new_empty(row.shape[0], len(layer_ids) * h)
                for j in (j for j, layer in enumerate(layer_ids) if layer == i):
                    feats[:, j * h : (j + 1) * h] = row

            hooks.append(self.layers[i].register_forward_hook(hook))
        try:
            kept = {} if cache is None else {cache_kwarg(self.backbone): cache}
            out = self.backbone(input_ids=ids_t, use_cache=cache is not None, **kept)
        except Exception as exc:
            raise UserError(
                f"transformers cannot run the text part of {self.info.architecture} "
                f"({self.info.backbone_class}) on its own: {one_line(exc)}"
            ) from None
        finally:
            for h in hooks:
                h.remove()
        return feats, out.last_hidden_state[0]


def cache_kwarg(backbone) -> str:
    """The keyword `backbone.forward` takes its cache by (``cache`` where transformers
    renamed it, else ``past_key_values``)."""
    import inspect

    params = inspect.signature(backbone.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def describe(path: str, dtype: torch.dtype | None = None) -> tuple[Any, nn.Module, TextLayout]:
    """Config, meta model and text layout of a target, without loading any weights."""
    d = describe_model(path, dtype)
    if d.layout.head_path is None:
        raise UserError(
            f"{d.layout.architecture} has no LM head (output embedding); it cannot "
            "be a speculative-decoding target"
        )
    return d.config, d.model, d.layout


def load_target(
    path: str,
    dtype: torch.dtype = torch.bfloat16,
    plan: tuple | None = None,
    ends_only: bool = False,
) -> Target:
    """Load only the text backbone + head of the target in ``path``, in ``dtype``; `plan`:
    `remote.model.load.plan_text`'s answer for it in that dtype, when made already;
    `ends_only`: its embedding and head alone (a `Target` that is not ``whole``)."""
    d = load_text(path, dtype, plan, ends_only=ends_only)
    return Target(d.model, d.layout, dtype, whole=not ends_only, folder=str(path))
