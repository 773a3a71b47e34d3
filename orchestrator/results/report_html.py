"""The HTML report's parts: styles, escaped cells, tables and inline figures."""

from __future__ import annotations

import html
from collections.abc import Callable
from typing import Any

from orchestrator.printable import printable
from orchestrator.results import plots

STYLE = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 24px auto; max-width: 1100px;
       color: #222; padding: 0 16px; }
h1 { font-size: 22px; } h2 { font-size: 18px; margin-top: 32px; }
table { border-collapse: collapse; margin: 8px 0 16px; font-size: 13px; }
th, td { border: 1px solid #ddd; padding: 3px 8px; text-align: right; vertical-align: top; }
th { background: #f4f4f4; } td.l, th.l { text-align: left; }
.mono { font-family: ui-monospace, monospace; font-size: 12px; text-align: left;
          word-break: break-all; }
.up { color: #1a7f37; } .down { color: #c62828; } .warn { color: #b26a00; }
figure { margin: 8px 0; } figure svg { max-width: 100%; height: auto; }
details { margin: 12px 0; border-top: 1px solid #eee; padding-top: 6px; }
summary { cursor: pointer; font-weight: 600; }
.plots { display: flex; flex-wrap: wrap; gap: 8px; }
.plots figure { flex: 1 1 480px; }
.note { color: #555; font-size: 13px; }
"""


def esc(v: Any) -> str:
    return html.escape(printable("-" if v is None else str(v)))


def number(v: Any, digits: int = 3) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def share(v: Any) -> str:
    return "-" if v is None else f"{100 * v:.1f}%"


def figure(make: Callable[[], Any], salt: str, caption: str, failed: list[str]) -> str:
    """The figure `make` draws, inline; a figure that fails leaves a note (and a line in
    `failed`) instead of costing the page."""
    try:
        fig = make()
        drawn = plots.svg(fig, salt) if fig is not None else None
    except Exception as exc:  # a plot is a view of the JSON; the page goes on without it
        failed.append(f"{caption}: {type(exc).__name__}: {exc}")
        return f'<p class="warn">{esc(caption)}: plot failed ({esc(type(exc).__name__)})</p>'
    if drawn is None:
        return f'<p class="note">{esc(caption)}: no data</p>'
    return (
        f'<figure data-plot="{esc(salt)}">{drawn}'
        f'<figcaption class="note">{esc(caption)}</figcaption></figure>'
    )


def table(head: list[str], rows: list[list[str]], left: int = 1) -> str:
    """A table from already-escaped cells; the first `left` columns left-aligned."""
    out = ["<table><thead><tr>"]
    out += [f'<th class="{"l" if i < left else ""}">{h}</th>' for i, h in enumerate(head)]
    out.append("</tr></thead><tbody>")
    for r in rows:
        out.append(
            "<tr>"
            + "".join(f'<td class="{"l" if i < left else ""}">{c}</td>' for i, c in enumerate(r))
            + "</tr>"
        )
    out.append("</tbody></table>")
    return "".join(out)


def delta_cells(d: Any) -> list[str]:
    """A paired delta (`compare.Delta`) and its interval, green or red when the whole
    interval is above or below 0."""
    cls = "up" if d.low > 0 else "down" if d.high < 0 else ""
    return [f'<span class="{cls}">{d.delta:+.3f}</span>', f"[{d.low:+.3f}, {d.high:+.3f}]"]
