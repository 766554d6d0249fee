"""Line charts drawn on the server as inline SVG: no chart library, nothing for the browser to fetch.

Each version is one line (its own colour and dash, so the lines differ without colour too), and
every chart carries a text summary (``<title>``/``aria-label``) for screen readers. A gap in the
data (no requests in an interval) is a gap in the line, never a zero.
"""
from __future__ import annotations

from markupsafe import Markup
from markupsafe import escape as _escape

W, H, PAD = 420, 140, 28
STYLES = [("#1f5fbf", ""), ("#b34700", "6 3"), ("#2e7d32", "2 2"), ("#6a1b9a", "8 3 2 3")]


def escape(text: str) -> str:
    """Escaped as a plain str (str + Markup would escape the str side again)."""
    return str(_escape(text))


def _scale(values: list[float]) -> tuple[float, float]:
    top = max(values) if values else 1.0
    return 0.0, top if top > 0 else 1.0


def _span(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min"


def _path(points: list[tuple[float, float | None]], x0: float, span: float, top: float) -> str:
    parts, pen_down = [], False
    for t, v in points:
        if v is None:
            pen_down = False
            continue
        x = PAD + (W - 2 * PAD) * (t - x0) / span
        y = H - PAD - (H - 2 * PAD) * v / top
        parts.append(f"{'L' if pen_down else 'M'}{x:.1f},{y:.1f}")
        pen_down = True
    return " ".join(parts)


def line_chart(title: str, unit: str, lines: dict[str, list[tuple[float, float | None]]],
               start: float, end: float) -> Markup:
    """``lines``: label (a version) -> (time, value) points between ``start`` and ``end``."""
    values = [v for pts in lines.values() for _, v in pts if v is not None]
    _, top = _scale(values)
    span = max(end - start, 1.0)
    summary = "; ".join(f"{label}: last {next((f'{v:.3g}' for _, v in reversed(pts) if v is not None), 'no data')} {unit}"
                        for label, pts in lines.items()) or "no data"
    out = [f'<figure class="chart"><svg viewBox="0 0 {W} {H}" role="img" aria-label="{escape(title)}: {escape(summary)}">',
           f"<title>{escape(title)}: {escape(summary)}</title>",
           f'<line x1="{PAD}" y1="{H - PAD}" x2="{W - PAD}" y2="{H - PAD}" class="axis"/>',
           f'<text x="{PAD}" y="{PAD - 8}" class="tick">{top:.3g} {escape(unit)}</text>',
           f'<text x="{PAD}" y="{H - 8}" class="tick">-{_span(end - start)}</text>',
           f'<text x="{W - PAD}" y="{H - 8}" class="tick" text-anchor="end">now</text>']
    for i, (label, pts) in enumerate(lines.items()):
        colour, dash = STYLES[i % len(STYLES)]
        d = _path(pts, start, span, top)
        if d:
            out.append(f'<path d="{d}" fill="none" stroke="{colour}" stroke-width="2" stroke-dasharray="{dash}"/>')
    out.append("</svg><figcaption>" + escape(title) + " " + "".join(
        f'<span class="key" style="--c:{STYLES[i % len(STYLES)][0]}">{escape(label)}</span>'
        for i, label in enumerate(lines)) + "</figcaption></figure>")
    return Markup("".join(out))
