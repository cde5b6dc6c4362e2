"""A picture of a generation, round by round: one self-contained HTML page (no script, no network).

Built from the per-round trace (`--json --trace`'s "trace"): each record's `drafted` ids, `accepted` count and
corrected or bonus `token`, and where present each draft's `p`, `q`, `u` and the round's `seconds_draft` and
`seconds_verify`; a missing field is left out, any other scalar field shown as it is. Each round is a row: its
drafts coloured accepted (u < p/q), rejected or unchecked, the target's token (corrected, bonus or target) and
a bar of its times; hovering a draft shows p, q, p/q and u. Letters as in Leviathan et al. 2023: p the target,
q the draft (notes/walkthrough.md). Imports npspec.sources.atomic (the atomic write) and the standard library.
"""

import html
from pathlib import Path

from ..sources.atomic import atomic_write

KINDS = {  # class -> what the legend says
    "accepted": "draft accepted (u < p/q)",
    "rejected": "draft rejected (the first with u >= p/q)",
    "unchecked": "draft after a rejection (never tested)",
    "corrected": "corrected token, from norm(max(0, p - q))",
    "bonus": "bonus token, from p after every draft was kept",
    "target": "target token (a round without drafts)",
}
KNOWN_FIELDS = {"drafted", "accepted", "token", "p", "q", "u", "seconds_draft", "seconds_verify"}

STYLE = """
body { font: 15px/1.5 system-ui, sans-serif; margin: 2em; color: #222; background: #fff; }
h1 { font-size: 1.3em; } .summary, .legend { color: #555; margin: 0.5em 0 1em; }
.tok { white-space: pre; border-radius: 3px; padding: 1px 2px; margin: 0 1px; font-family: ui-monospace, monospace; }
.tok:hover { outline: 2px solid #333; }
.prompt { color: #555; }
.accepted { background: #c8f0c8; } .rejected { background: #f6c4c4; text-decoration: line-through; }
.unchecked { background: #eee; color: #999; } .corrected { background: #fbd9a6; }
.bonus { background: #bcd8f6; } .target { background: #ddd2f2; }
.text { border: 1px solid #ddd; padding: 0.8em; line-height: 2; }
table { border-collapse: collapse; margin-top: 1em; } td, th { padding: 4px 8px; border-bottom: 1px solid #eee;
  text-align: left; vertical-align: middle; }
.time { display: flex; height: 10px; width: 160px; background: #f4f4f4; }
.draft-time { background: #7aa7d8; } .verify-time { background: #d88a7a; }
.ms { color: #777; font-size: 0.85em; } .extra { color: #777; font-size: 0.85em; }
.key { display: inline-block; width: 10px; height: 10px; }
"""


def _number(x):
    """x as a float, or None if it is missing or not a number."""
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else None


def _at(values, i):
    """values[i] as a float, or None (values missing, too short, or not numbers)."""
    return _number(values[i]) if isinstance(values, list) and i < len(values) else None


def token_kinds(record):
    """[(id, class, p, q, u)] of one trace record: its drafts, then its corrected, bonus or target token (if any)."""
    drafted = [int(x) for x in record.get("drafted") or []]
    n = int(record.get("accepted") or 0)
    out = []
    for i, d in enumerate(drafted):
        kind = "accepted" if i < n else "rejected" if i == n else "unchecked"
        out.append((d, kind, _at(record.get("p"), i), _at(record.get("q"), i), _at(record.get("u"), i)))
    token = record.get("token")
    if token is not None:
        kind = "target" if not drafted else "bonus" if n >= len(drafted) else "corrected"
        out.append((int(token), kind, None, None, None))
    return out


def _hover(kind, p, q, u):
    parts = [KINDS[kind]]
    if p is not None:
        parts.append(f"p = {p:.4g}")
    if q is not None:
        parts.append(f"q = {q:.4g}")
    if p is not None and q:
        parts.append(f"p/q = {p / q:.4g}")
    if u is not None:
        parts.append(f"u = {u:.4g}")
    return "; ".join(parts)


def _span(text, kind, p=None, q=None, u=None, token_id=None):
    attrs = f' class="tok {kind}" title="{html.escape(_hover(kind, p, q, u))}"'
    if token_id is not None:
        attrs += f' data-id="{token_id}"'
    for name, value in (("p", p), ("q", q), ("u", u)):
        if value is not None:
            attrs += f' data-{name}="{value!r}"'
    return f"<span{attrs}>{html.escape(text)}</span>"


def render(trace, decode=None, prompt="", stats=None, title="Speculative decoding, round by round"):
    """The HTML page (a str) of `trace` (a list of dicts, module docstring). decode(ids) -> text (None, or a token
    without text: the id is shown, as [50256]); prompt: shown first; stats: Stats.as_dict() or None for the
    summary. Raises TypeError if `trace` is not a list of dicts."""
    if not isinstance(trace, list) or not all(isinstance(r, dict) for r in trace):
        raise TypeError("trace must be a list of dicts, one per round (speculative_generate(..., trace=True))")

    def text_of(token_id, newline="\u21b5"):  # a visible newline sign; the running text also breaks the line
        text = decode([token_id]) if decode is not None else ""
        return text.replace("\n", newline) if text else f"[{token_id}]"  # no text (none, or a special token): the id

    longest = max([(_number(r.get("seconds_draft")) or 0) + (_number(r.get("seconds_verify")) or 0) for r in trace]
                  + [0.0])
    reading, rows = [], []
    for i, record in enumerate(trace, 1):
        tokens = token_kinds(record)
        spans = [_span(text_of(t), kind, p, q, u, t) for t, kind, p, q, u in tokens]
        reading += [_span(text_of(t, "\u21b5\n"), kind, p, q, u, t) for t, kind, p, q, u in tokens
                    if kind not in ("rejected", "unchecked")]
        draft_s, verify_s = _number(record.get("seconds_draft")), _number(record.get("seconds_verify"))
        timing = ""
        if draft_s is not None or verify_s is not None:
            d, v = draft_s or 0.0, verify_s or 0.0
            scale = 100.0 / longest if longest > 0 else 0.0
            timing = (f'<div class="time" title="draft {1e3 * d:.2f} ms, verify {1e3 * v:.2f} ms">'
                      f'<div class="draft-time" style="width:{d * scale:.1f}%"></div>'
                      f'<div class="verify-time" style="width:{v * scale:.1f}%"></div></div>'
                      f'<span class="ms">{1e3 * d:.1f} + {1e3 * v:.1f} ms</span>')
        extra = ", ".join(f"{html.escape(str(k))}: {html.escape(str(v))}" for k, v in record.items()
                          if k not in KNOWN_FIELDS and isinstance(v, (str, int, float, bool)))
        n, drafted = int(record.get("accepted") or 0), len(record.get("drafted") or [])
        rows.append(f'<tr class="round"><td>{i}</td><td>{n} of {drafted}</td><td>{"".join(spans)}</td>'
                    f'<td>{timing}</td><td class="extra">{extra}</td></tr>')
    summary = ""
    if isinstance(stats, dict):
        keys = [("new_tokens", "new tokens"), ("rounds", "rounds"), ("alpha", "alpha"),
                ("tokens_per_round", "tokens/round"), ("tokens_per_s", "tokens/s"), ("stop_reason", "stop")]
        summary = ", ".join(f"{label} {stats[k]:.3g}" if isinstance(stats[k], float) else f"{label} {stats[k]}"
                            for k, label in keys if stats.get(k) is not None)
    legend = " ".join(_span(kind, kind) for kind in KINDS)
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>{STYLE}</style></head>
<body>
<h1>{html.escape(title)}</h1>
<p class="summary">{html.escape(summary)}</p>
<p class="legend">{legend}</p>
<div class="text"><span class="prompt">{html.escape(prompt)}</span>{"".join(reading)}</div>
<table><thead><tr><th>round</th><th>kept</th><th>drafts, then the target's token (hover: p, q, u)</th>
<th><span class="key draft-time"></span> draft + <span class="key verify-time"></span> verify time</th><th></th>
</tr></thead>
<tbody>
{chr(10).join(rows)}
</tbody></table>
</body></html>
"""


def write(path, trace, decode=None, prompt="", stats=None):
    """Write render(trace, decode, prompt, stats) to `path` atomically (UTF-8; sources.atomic.atomic_write: a
    regular file is replaced whole, anything else refused); returns the Path. Raises TypeError for a malformed
    trace, OSError (NotRegularFile among them) if the file cannot be written."""
    path = Path(path)
    page = render(trace, decode, prompt, stats)
    atomic_write(path, lambda tmp: Path(tmp).write_text(page, encoding="utf-8"))
    return path
