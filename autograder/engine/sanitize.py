"""The one place where text a submission controls becomes safe to store and show.

A submission chooses exception messages, type names, qualnames, file names (in any encoding: a
folder unpacked by an old zip tool has names that are not UTF-8), what it prints, and the names of
the entries in a batch. Each such string passes through `line` (or `block`, for printed output)
ONCE, where it enters the judge or the intake; everything downstream may then assume printable,
bounded, valid UTF-8. The renderers escape for their format with `markdown`, `code` and `fence`.

    line(b"a\\x1b[31mred\\nb\\xff")    -> 'a\\x1b[31mred b\\xff'   (one line, escapes spelled out)
    markdown("**100/100** <b>")        -> '\\*\\*100/100\\*\\* &lt;b&gt;'
    fence("x```y")                     -> '````text\\nx```y\\n````'
    code("a@b.example")                -> '`a@b.example`'
"""
from __future__ import annotations

import re
import unicodedata

LINE_CHARS = 300  # one message, name or path
BLOCK_CHARS = 4000  # printed output kept for one test
BLOCK_LINES = 200

# Categories that are not shown as themselves: controls (escape sequences), format characters
# (bidi overrides, zero-width joiners), surrogates, private use, unassigned, line/paragraph separators.
_HIDDEN = {"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"}
_WS = re.compile(r"\s+")


def _text(value: object) -> str:
    """Any value as a str without lone surrogates (bytes that were not UTF-8 come back as \\xNN)."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).decode("utf-8", "backslashreplace")
    text = value if isinstance(value, str) else str(value)
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        pass
    try:  # a name decoded by the OS with surrogateescape: show its original bytes
        return text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")


def _printable(text: str, keep: str = "") -> str:
    if text.isprintable():  # no category Cc, Cf, Cs, Co, Cn, Z* but the ASCII space: nothing to change
        return text
    out = []
    for ch in text:
        if ch in keep:
            out.append(ch)
        elif ch.isspace() and ch not in "\u2028\u2029\x85":
            out.append(" ")
        elif unicodedata.category(ch) in _HIDDEN:
            o = ord(ch)
            out.append(f"\\x{o:02x}" if o < 0x100 else f"\\u{o:04x}" if o < 0x10000 else f"\\U{o:08x}")
        else:
            out.append(ch)
    return "".join(out)


def _cut(text: str, limit: int) -> str:
    """text in at most `limit` characters: cut at the last space of its final quarter where there is
    one (a word is never cut in the middle), and marked with an ellipsis."""
    if len(text) <= limit:
        return text
    head = text[: max(0, limit - 1)]
    space = head.rfind(" ")
    if space >= (3 * limit) // 4:
        head = head[:space].rstrip(" ,;:")
    return head + "…"


def line(value: object, limit: int = LINE_CHARS) -> str:
    """One line of printable text, at most `limit` characters, from anything a submission chose."""
    try:
        text = _text(value)
    except Exception:  # noqa: BLE001 -- a str() that raises is itself submission-controlled
        return "(unprintable)"
    return _cut(_WS.sub(" ", _printable(text)).strip(), limit)


def name(value: object, limit: int = LINE_CHARS) -> str:
    """A file or entry name as one printable line that still tells names apart: whitespace other
    than inner spaces is spelled out (\\x09), and a name of spaces is shown in quotes."""
    try:
        text = _text(value)
    except Exception:  # noqa: BLE001
        return "(unprintable)"
    text = "".join(f"\\x{ord(c):02x}" if c.isspace() and c != " " and ord(c) < 0x100 else c for c in text)
    out = _cut(_printable(text), limit)
    return out if out.strip() and out == out.strip() else f'"{out}"'


def block(value: object, limit: int = BLOCK_CHARS, max_lines: int = BLOCK_LINES) -> str:
    """Multi-line printable text (printed output): each line as `line` would clean it, but spaces
    kept; at most `max_lines` lines and `limit` characters in all."""
    try:
        text = _text(value)
    except Exception:  # noqa: BLE001
        return "(unprintable)"
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    rows = [_printable(r, keep="\t").replace("\t", "    ").rstrip() for r in text.split("\n")]
    cut = len(rows) > max_lines
    out = "\n".join(rows[:max_lines])
    if cut or len(out) > limit:
        out = _cut(out, limit) + f"\n[... truncated: {len(text)} characters, {len(rows)} lines in all]"
    return out


_MD_SPECIAL = re.compile(r"([\\`*_{}\[\]()#+!|~$])")
_MD_LEAD = re.compile(r"^(\s*)(\d+)([.)])|^(\s*)([-=])")  # a list item or heading underline at the start
# What GFM's autolinks (https://github.github.com/gfm/#autolinks-extension-) key on, escaped: a `:`
# before a non-space (any scheme: https://, ftp://, mailto:, xmpp:, javascript:; :emoji: codes
# too), every `@` (e-mail addresses), and the dot of the `www.` trigger. Other dots stay as they
# are (conftest.py, 1.5e-03): GFM links no bare domain name.
_MD_AUTOLINK = re.compile(r":(?=\S)|@|(?<=www)\.", re.IGNORECASE)


def markdown(text: str) -> str:
    """Inline markdown that renders as exactly `text` (one line): markdown punctuation is
    backslash-escaped (emphasis, code, links, tables, headings, math; a list marker at the start),
    so is what GFM's autolinks key on (the `:` of a scheme, `@`, the dot of `www.`: a
    submission-chosen `https://evil.example`, `www.evil.example` or `a@b.example` is not made a
    link), and the HTML characters become entities.

    Known limits: cmark-gfm (GitHub) finds e-mail addresses after it has merged the text back
    together, escapes removed, so there `a@b.example` in feedback.md is still a mailto: link (no
    escape can stop that without changing the text; its www. and https:// autolinks are stopped):
    the student's id and the intake notes, which name the submission's files, are shown with `code`;
    and linkify-style renderers that link bare names with a known top-level domain (`evil.com`,
    markdown-it with linkify) are not GFM and are not defeated."""
    text = _MD_SPECIAL.sub(r"\\\1", line(text, 10 * LINE_CHARS))
    text = _MD_AUTOLINK.sub(r"\\\g<0>", text)
    text = _MD_LEAD.sub(lambda m: f"{m[1]}{m[2]}\\{m[3]}" if m[2] else f"{m[4]}\\{m[5]}", text)
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def code(value: object) -> str:
    """Inline code that renders as exactly `value` (one line, cleaned by `line`): inside a code span
    no markdown, HTML or autolink applies, so a submission-chosen e-mail address stays plain text
    even on GitHub, which links addresses that `markdown` has escaped. The backtick run is longer
    than any inside; content that starts or ends with a backtick is padded with a space (which the
    renderer strips). Not for GFM table cells: a `|` ends a cell even inside code."""
    text = line(value, 10 * LINE_CHARS) or "(empty)"
    ticks = "`" * (max((len(m) for m in re.findall(r"`+", text)), default=0) + 1)
    pad = " " if text[0] == "`" or text[-1] == "`" else ""
    return f"{ticks}{pad}{text}{pad}{ticks}"


def fence(text: str, info: str = "text") -> str:
    """A fenced code block that `text` cannot close: the fence is longer than any run of backticks
    inside it."""
    longest = max((len(m) for m in re.findall(r"`+", text)), default=0)
    f = "`" * max(3, longest + 1)
    return f"{f}{info}\n{text.rstrip(chr(10))}\n{f}"
