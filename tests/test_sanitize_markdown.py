"""sanitize.markdown: a submission-chosen string (a name, a message) in feedback.md or Gradescope
output renders as exactly that text: no markup, and no autolink (https://..., www...., a@b.c).

Rendered with the renderers installed here (mistune with its url plugin and the GFM-ish plugins,
markdown-it-py's CommonMark with tables and strikethrough), and checked on the escaped string's
structure against the GFM autolink rules (https://github.github.com/gfm/#autolinks-extension-), which
cmark-gfm applies to the raw text, backslashes still in it, while it parses."""
from __future__ import annotations

import html
import re
from html.parser import HTMLParser

import mistune
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from markdown_it import MarkdownIt

from autograder.engine import sanitize

# escape=False: mistune's escape mode also escapes entity references (&lt; shows as "&lt;"), which is not
# CommonMark; raw HTML passing through would show up as a tag below, so nothing is hidden by it.
MISTUNE = mistune.create_markdown(escape=False, plugins=["url", "strikethrough", "table", "footnotes", "task_lists"])
MDIT = MarkdownIt("commonmark").enable(["table", "strikethrough"])
RENDERERS = {"mistune": MISTUNE, "markdown-it": MDIT.render}

# What a GFM renderer would make a link of, in raw markdown text: the extended www, url and protocol
# autolinks and e-mail addresses (any scheme counts, not only GFM's http(s)/ftp/mailto/xmpp).
_START = r"(?:(?<=^)|(?<=[\s*_~(]))"
AUTOLINK = re.compile(
    _START + r"www\."
    r"|[A-Za-z][A-Za-z0-9+.-]{1,31}:(?://|[^\s\\])"  # a scheme: https://, mailto:x, xmpp:x
    r"|[A-Za-z0-9.+_-]+@[A-Za-z0-9_-]+\.[A-Za-z0-9_-]",  # an e-mail address
    re.IGNORECASE,
)

CASES = [
    "https://evil.example/x",
    "see http://evil.example?a=1 now",
    "www.evil.example",
    "(www.evil.example)",
    "a@b.example",
    "mail me: first.last+tag@evil.example.",
    "mailto:a@b.example",
    "xmpp:a@b.example/r",
    "ftp://evil.example",
    "javascript:alert(1)",
    "*https://evil.example*",
    "student_https://evil.example_name",
    "WWW.EVIL.EXAMPLE",
    "www.123.example",
]


class _Tags(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[str] = []
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list) -> None:
        self.tags.append(tag)

    def handle_startendtag(self, tag: str, attrs: list) -> None:
        self.tags.append(tag)

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def _parse(rendered: str) -> tuple[set[str], str]:
    p = _Tags()
    p.feed(rendered)
    p.close()
    return set(p.tags), " ".join("".join(p.text).split())


@pytest.mark.parametrize("text", CASES)
def test_a_submission_chosen_url_or_address_is_not_made_a_link(text):
    assert AUTOLINK.search(text), "the scanner finds the autolink in the raw text (so it can fail)"
    md = sanitize.markdown(text)
    assert not AUTOLINK.search(md), md
    for name, render in RENDERERS.items():
        tags, content = _parse(render(md))
        assert tags <= {"p"}, (name, md, render(md))
        assert content == " ".join(text.split()), (name, md)


def test_the_renderer_would_link_the_raw_text():
    """mistune's url plugin links the unescaped https:// cases: the test above can tell."""
    assert "<a " in MISTUNE("https://evil.example/x")
    assert "<a " not in MISTUNE(sanitize.markdown("https://evil.example/x"))


def test_ordinary_text_stays_readable():
    """Numbers, versions and prose are left alone; only the punctuation that could form a link or
    markup is escaped."""
    assert sanitize.markdown("AssertionError: max error 1.5e-03 at row 2.") == "AssertionError: max error 1.5e-03 at row 2."
    assert sanitize.markdown("torch 2.13.0, ip 10.0.0.1") == "torch 2.13.0, ip 10.0.0.1"
    assert sanitize.markdown("expected float32, got int") == "expected float32, got int"
    assert sanitize.markdown("ignored conftest.py, kept online_softmax.py") == r"ignored conftest.py, kept online\_softmax.py"
    assert sanitize.markdown("see: www.x") == r"see: www\.x"
    assert sanitize.markdown("a @ b") == r"a \@ b"


_PIECES = st.sampled_from(["https://", "http://", "www.", "WWW.", "@", ".", ":", "//", "mailto:", "evil", "example",
                           "a", "Z", "1", "9", " ", "/", "-", "_", "\\", "*", "(", ")", "~", "<", ">", "&", "[", "]",
                           "#", "`", "|", "$", "1.", "- ", "+", "=", "!", "\t", "é", "ü.de"])
_TEXT = st.one_of(st.text(max_size=80), st.lists(_PIECES, max_size=16).map("".join))


@settings(max_examples=400, deadline=None)
@given(_TEXT)
def test_any_text_renders_as_itself_with_no_link_and_no_markup(text):
    md = sanitize.markdown(text)
    want = " ".join(sanitize.line(text, 10 * sanitize.LINE_CHARS).split())
    assert not AUTOLINK.search(md), md
    for name, render in RENDERERS.items():
        out = render(md)
        tags, content = _parse(out)
        assert tags <= {"p", "br"}, (name, md, out)
        assert content == want, (name, md, out)
    assert html.unescape(md).replace("\\", "") == sanitize.line(text, 10 * sanitize.LINE_CHARS).replace("\\", "")


# sanitize.code: the student's id and intake notes (which hold file names) in feedback.md and on
# Gradescope. Inside a code span no markup and no autolink applies (GFM's autolink extension skips
# code), so an e-mail address that GitHub would link even escaped stays text.

@settings(max_examples=400, deadline=None)
@given(_TEXT)
def test_code_renders_as_exactly_the_text_in_one_code_span(text):
    md = sanitize.code(text)
    want = sanitize.line(text, 10 * sanitize.LINE_CHARS) or "(empty)"
    assert "\n" not in md
    for name, render in RENDERERS.items():
        out = render(md)
        tags, _ = _parse(out)
        assert tags == {"p", "code"}, (name, md, out)
        inner = re.fullmatch(r"<p><code>(.*)</code></p>\n", out, re.S)
        assert inner and html.unescape(inner.group(1)) == want, (name, md, out)


@pytest.mark.parametrize("text", CASES + ["`", "``x``", "a ` b", "- item", "# heading", "| a | b |"])
def test_code_makes_no_link_of_an_address_or_url(text):
    for name, render in RENDERERS.items():
        out = render(sanitize.code(text))
        assert "<a" not in out and _parse(out)[0] == {"p", "code"}, (name, out)
