"""Plain-text tables for people (programs get --json)."""

import re

# what a cell must not send to a terminal: control characters (escape sequences) shown escaped
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def _cell(v) -> str:
    text = "-" if v is None else str(v)
    return _CONTROL.sub(lambda m: repr(m.group())[1:-1], text)


def table(headers: list[str], rows: list[list], align: str | None = None) -> str:
    cells = [[_cell(h) for h in headers]] + [[_cell(v) for v in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    align = align or "l" + "r" * (len(headers) - 1)

    def fmt(r):
        return "  ".join(c.ljust(w) if a == "l" else c.rjust(w) for c, w, a in zip(r, widths, align)).rstrip()

    lines = [fmt(cells[0]), "  ".join("-" * w for w in widths)]
    lines += [fmt(r) for r in cells[1:]]
    return "\n".join(lines)
