"""`-f svg`: an SVG flame graph in flamegraph.pl's look (1200 px wide,
16 px frames, the warm palette on a pale yellow background, the root at
the bottom), each frame with a `<title>` tooltip `name (N samples, P%)` as
flamegraph.pl writes it. In a browser its inline script (assets/
flamegraph-svg.js) adds flamegraph.pl's click to zoom, "Reset Zoom" and
"Search"; image viewers show it static."""
from __future__ import annotations

import zlib
from io import TextIOBase
from xml.sax.saxutils import escape, quoteattr

from .flamegraph_html import amount, asset, graph_title, unit_of
from .flametree import TreeReport, placed
from .text import format_duration

WIDTH = 1200                  # flamegraph.pl's defaults
FRAME_H = 16
FONT_SIZE = 12
FONT_WIDTH = 0.59             # average character width, in font sizes
MIN_WIDTH = 0.1               # px: narrower frames are left out
XPAD = 10
YPAD_TOP = FONT_SIZE * 5      # title and subtitle
YPAD_BOTTOM = FONT_SIZE * 2 + 10


def _hash(text: str) -> float:
    """A stable [0, 1) per name (flamegraph.pl --hash: same name, same colour)."""
    return zlib.crc32(text.encode()) / 2**32


def frame_colour(name: str, kind: str, inlined: bool) -> str:
    """flamegraph.pl's palettes: hot for code, yellow for libraries, orange
    for the kernel, aqua for the Go runtime, blue for Python, violet for
    Perl, green for JIT
    code (JavaScript, Java), grey for what is not code."""
    v1, v2 = _hash(name), _hash(name[::-1])
    if kind == "kernel":
        r, g, b = 190 + 65 * v1, 90 + 65 * v1, 0
    elif kind == "lib":
        r, g, b = 175 + 55 * v1, 175 + 55 * v1, 50 + 20 * v2
    elif kind == "go":
        r, g, b = 50 + 60 * v1, 165 + 55 * v1, 165 + 55 * v1
    elif kind == "python":
        r, g, b = 80 + 50 * v1, 120 + 50 * v1, 200 + 55 * v2
    elif kind == "php":                       # PHP's violet
        r, g, b = 120 + 40 * v1, 110 + 40 * v1, 180 + 60 * v2
    elif kind == "perl":                      # violet beside Python's blue
        r, g, b = 150 + 50 * v1, 100 + 40 * v1, 200 + 55 * v2
    elif kind == "ruby":
        r, g, b = 200 + 55 * v1, 60 + 40 * v1, 80 + 40 * v2
    elif kind in ("js", "java"):              # flamegraph.pl's green for JIT code
        r, g, b = 50 + 60 * v1, 190 + 65 * v1, 50 + 60 * v1 + (40 if kind == "js" else 0)
    elif kind in ("separator", "unknown", "note"):
        r = g = b = 160 + 40 * v1
    else:
        r, g, b = 205 + 50 * v2, 230 * v1, 55 * v2
    if inlined:                       # a lighter shade of the same colour
        r, g, b = (c + (255 - c) * 0.45 for c in (r, g, b))
    return f"rgb({int(r)},{int(g)},{int(b)})"


def _label(name: str, width: float) -> str:
    fits = int(width / (FONT_SIZE * FONT_WIDTH))
    if fits < 3:
        return ""
    return name if len(name) <= fits else name[:fits - 2] + ".."


def render_svg(root, title: str, subtitle: str, unit: str) -> str:
    frames = list(placed(root))
    depth_max = max((d for d, _, _ in frames), default=0)
    height = (depth_max + 1) * FRAME_H + YPAD_TOP + YPAD_BOTTOM
    total = root.value or 1
    per_sample = (WIDTH - 2 * XPAD) / total
    out = [
        '<?xml version="1.0" standalone="no"?>',
        f'<svg version="1.1" width="{WIDTH}" height="{height}" '
        f'viewBox="0 0 {WIDTH} {height}" xmlns="http://www.w3.org/2000/svg">',
        '<defs><linearGradient id="background" y1="0" y2="1" x1="0" x2="0">'
        '<stop stop-color="#eeeeee" offset="5%"/><stop stop-color="#eeeeb0" offset="95%"/>'
        '</linearGradient></defs>',
        '<style type="text/css">text { font-family: Verdana, "DejaVu Sans", sans-serif; '
        f'font-size: {FONT_SIZE}px; fill: rgb(0,0,0); }} '
        '#title { text-anchor: middle; font-size: 17px; } '
        '#subtitle { text-anchor: middle; fill: rgb(90,90,90); } '
        '#unzoom, #search { cursor: pointer; } g.frame { cursor: pointer; }</style>',
        f'<rect x="0" y="0" width="{WIDTH}" height="{height}" fill="url(#background)"/>',
        f'<text id="title" x="{WIDTH / 2:.1f}" y="{FONT_SIZE * 2}">{escape(title)}</text>',
        f'<text id="subtitle" x="{WIDTH / 2:.1f}" y="{FONT_SIZE * 4}">{escape(subtitle)}</text>',
        f'<text id="unzoom" x="{XPAD}" y="{FONT_SIZE * 2}" style="opacity: 0">Reset Zoom</text>',
        f'<text id="search" x="{WIDTH - XPAD - 100}" y="{FONT_SIZE * 2}">Search</text>',
        f'<text id="details" x="{XPAD}" y="{height - YPAD_BOTTOM / 2:.0f}"> </text>',
        f'<text id="matched" x="{WIDTH - XPAD - 100}" y="{height - YPAD_BOTTOM / 2:.0f}"></text>',
        '<g id="frames">',
    ]
    for depth, start, node in frames:
        width = node.value * per_sample
        if width < MIN_WIDTH:
            continue
        x = XPAD + start * per_sample
        y = height - YPAD_BOTTOM - (depth + 1) * FRAME_H + 1
        value = (format_duration(node.value) if unit == "nanoseconds"
                 else f"{node.value:,} {unit}")
        info = f"{node.name} ({value}, {100 * node.value / total:.2f}%)"
        if node.module:
            info += f" [{node.module}]"
        out.append(
            f'<g class="frame" data-name={quoteattr(node.name)} data-depth="{depth}" '
            f'data-start="{start}" data-value="{node.value}">'
            f'<title>{escape(info)}</title>'
            f'<rect x="{x:.1f}" y="{y}" width="{width:.1f}" height="{FRAME_H - 1}" '
            f'fill={quoteattr(frame_colour(node.name, node.kind, node.inlined))} rx="2" ry="2"/>'
            f'<text x="{x + 3:.1f}" y="{y + FRAME_H / 2 + 4:.1f}">'
            f'{escape(_label(node.name, width))}</text></g>')
    out.append("</g>")
    # last: it runs as it is parsed, and finds the frames above it
    out.append(f'<script type="text/ecmascript"><![CDATA[\n{asset("flamegraph-svg.js")}]]></script>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


class SvgFlameGraphReport(TreeReport):
    """Counted stacks as an SVG flame graph."""

    def finish(self, out: TextIOBase) -> None:
        root = self.tree()
        out.write(render_svg(root, graph_title(self.context, "Flame Graph"),
                             f"{self.command()} · {amount(root.value, self.context)}",
                             unit_of(self.context)))
