"""The one model reader of the host side: probe, preflight, drafter checks and the eval engine
all read a model through this package, so they cannot disagree about a checkpoint.

- `files`: ``config.json``, the safetensors index and shard headers (one header reader),
  completeness, and lazy tensor reads;
- `layout`: the model built on the meta device; its text backbone, decoder layers, final
  norm and head found by inspecting the module tree; text vs vision;
- `keys`: checkpoint key <-> module key through transformers' own conversion mapping;
- `load`: the text part only, through transformers' own loader and buffer init.

Only `files` is importable without torch.
"""
