"""Pictures of compiled instances: what the compiler let each token attend to, and with which label.

    render(instance, queries=None, keys=None) -> Rendering     PNG/SVG via matplotlib (Agg)
    write_viewer(instance, "x.html")                           self-contained zoomable HTML page
    terminal_view(instance, style="letters") -> str            text grid for small instances
    block_summary(Pattern(instance), block_size=16)            per-block share and dominant label

Names load on first use, so the terminal view never imports matplotlib.
"""

from graphattn.lazy import lazy_exports

_EXPORTS = {
    "render": "graphattn.viz.picture",
    "Rendering": "graphattn.viz.picture",
    "write_viewer": "graphattn.viz.html",
    "viewer_html": "graphattn.viz.html",
    "terminal_view": "graphattn.viz.terminal",
    "block_summary": "graphattn.viz.blocks",
    "BlockSummary": "graphattn.viz.blocks",
    "Pattern": "graphattn.viz.pattern",
    "AxisRange": "graphattn.viz.pattern",
    "parse_range": "graphattn.viz.pattern",
    "label_colors": "graphattn.viz.palette",
}

__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
