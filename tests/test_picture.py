"""The picture of each round (npspec.cli.picture, `--html FILE`): the page's content, read back with html.parser, on a
hand-made trace (one row per case, as commented) and on a real run; a real browser's rendering in the slow suite."""

import html.parser
import io
import shutil
import struct
import subprocess
import zlib

import pytest

from npspec.cli import picture
from npspec.cli.generate import build_parser, main, run
from npspec.sources import load

ROUNDS = [
    {"drafted": [1, 2, 3], "accepted": 1, "token": 9, "p": [0.5, 0.1, 0.3], "q": [0.4, 0.5, 0.2],
     "u": [0.3, 0.9, 0.1], "seconds_draft": 0.002, "seconds_verify": 0.006},  # accepts 1, rejects 2, 3 untested
    {"drafted": [4, 5], "accepted": 2, "token": 6},  # all kept: bonus 6 (an older trace: no p, q, u, times)
    {"drafted": [], "accepted": 0, "token": 7, "seconds_verify": 0.004},  # no drafts: the target's own token
    {"drafted": [8], "accepted": 1, "token": None, "drafter": "ngram", "proposal_length": 1,
     "p": [1.0], "q": [1.0], "u": None},  # an accepted EOS ends the round; fields added later are shown as they are
]
WORDS = {i: f"w{i}" for i in range(10)} | {5: "five\n"}


class Page(html.parser.HTMLParser):
    """The page's token spans, in order: (where, class, text, attributes); where is "text" or the round number."""

    def __init__(self, text):
        super().__init__()
        self.tokens, self.tags, self.where, self.round, self.open = [], [], None, 0, None
        self.extra = []
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self.tags.append((tag, a))
        classes = (a.get("class") or "").split()
        if tag == "div" and "text" in classes:
            self.where = "text"
        elif tag == "tr" and "round" in classes:
            self.round += 1
            self.where = self.round
        elif tag == "td" and "extra" in classes:
            self.extra.append("")
        if tag == "span" and "tok" in classes and self.where is not None:
            self.open = [self.where, classes[1], "", a]
            self.tokens.append(self.open)

    def handle_endtag(self, tag):
        if tag == "span":
            self.open = None
        elif tag == ("div" if self.where == "text" else "tr"):  # the running text's div holds only spans
            self.where = None

    def handle_data(self, data):
        if self.open is not None:
            self.open[2] += data
        elif self.extra and self.where is not None and self.tags[-1][0] == "td" and \
                "extra" in (self.tags[-1][1].get("class") or ""):
            self.extra[-1] += data

    def row(self, where):
        return [(kind, text) for w, kind, text, _ in self.tokens if w == where]


def decode(ids):
    return "".join(WORDS[i] for i in ids)


def test_each_round_is_a_row_coloured_by_what_happened():
    page = Page(picture.render(ROUNDS, decode, prompt="P:"))
    assert page.row(1) == [("accepted", "w1"), ("rejected", "w2"), ("unchecked", "w3"), ("corrected", "w9")]
    assert page.row(2) == [("accepted", "w4"), ("accepted", "five\u21b5"), ("bonus", "w6")]
    assert page.row(3) == [("target", "w7")]
    assert page.row(4) == [("accepted", "w8")]
    # the running text: what was emitted, in order, newlines kept (after a visible sign)
    assert page.row("text") == [("accepted", "w1"), ("corrected", "w9"), ("accepted", "w4"),
                                ("accepted", "five\u21b5\n"), ("bonus", "w6"), ("target", "w7"), ("accepted", "w8")]
    assert page.extra[3] == "drafter: ngram, proposal_length: 1" and page.extra[0] == ""


def test_hovering_a_draft_shows_p_q_and_u():
    page = Page(picture.render(ROUNDS, decode))
    first, second = (t for t in page.tokens if t[0] == 1 and t[1] in ("accepted", "rejected"))
    assert first[3]["title"] == "draft accepted (u < p/q); p = 0.5; q = 0.4; p/q = 1.25; u = 0.3"
    assert second[3]["title"] == "draft rejected (the first with u >= p/q); p = 0.1; q = 0.5; p/q = 0.2; u = 0.9"
    assert (float(first[3]["data-p"]), float(first[3]["data-q"]), float(first[3]["data-u"])) == (0.5, 0.4, 0.3)
    no_numbers = [t for t in page.tokens if t[0] == 2][0]
    assert "data-p" not in no_numbers[3] and no_numbers[3]["title"] == "draft accepted (u < p/q)"


def test_the_page_is_self_contained():
    text = picture.render(ROUNDS, decode)
    page = Page(text)
    tags = [t for t, _ in page.tags]
    assert "script" not in tags and "link" not in tags and "img" not in tags and "style" in tags
    assert "http://" not in text and "https://" not in text
    times = [a for t, a in page.tags if t == "div" and a.get("class") == "time"]
    assert [a["title"] for a in times] == ["draft 2.00 ms, verify 6.00 ms", "draft 0.00 ms, verify 4.00 ms"]


def test_text_is_escaped_and_ids_shown_without_a_decoder():
    page = Page(picture.render([{"drafted": [0], "accepted": 0, "token": 1}], lambda ids: "<b>&" if ids == [0] else "x",
                               prompt="<i>"))
    assert page.row(1) == [("rejected", "<b>&"), ("corrected", "x")]  # read back as text: it was escaped
    assert "<i>" not in picture.render([], prompt="<i>") and "&lt;i&gt;" in picture.render([], prompt="<i>")
    assert Page(picture.render(ROUNDS[:1])).row(1)[0] == ("accepted", "[1]")
    assert Page(picture.render(ROUNDS[:1], lambda ids: "")).row(1)[0] == ("accepted", "[1]")  # e.g. <|endoftext|>


def test_a_malformed_trace_is_refused():
    with pytest.raises(TypeError, match="trace must be a list of dicts"):
        picture.render({"drafted": []})


ARGS = ["ROMEO:", "--max-new-tokens", "40", "--seed", "3", "--gamma", "4"]


@pytest.mark.parametrize("temperature", ["0.8", "0"])
def test_html_of_a_real_run(tmp_path, temperature):
    path = tmp_path / "round.html"
    gen = run(build_parser().parse_args(ARGS + ["--temperature", temperature, "--html", str(path)]),
              out=io.StringIO(), err=io.StringIO())
    page = Page(path.read_text(encoding="utf-8"))
    rows = [page.row(i + 1) for i in range(gen.stats.rounds)]
    assert page.round == gen.stats.rounds == len(gen.trace)
    assert sum(kind == "accepted" for row in rows for kind, _ in row) == gen.stats.accepted
    assert sum(kind == "rejected" for row in rows for kind, _ in row) == gen.stats.rejected
    from_page = "".join(text for _, text in page.row("text")).replace("\u21b5\n", "\n")
    tokenizer = load(None, "target").tokenizer  # the shipped target's, decoding token by token as the page does
    assert from_page == "".join(tokenizer.decode([i]) or f"[{i}]" for i in gen.ids)  # an id where no text
    for w, kind, _, a in page.tokens:
        if w != "text" and kind in ("accepted", "rejected") and temperature != "0":
            u, ratio = float(a["data-u"]), float(a["data-p"]) / float(a["data-q"])
            assert (u < ratio) == (kind == "accepted")  # the page shows the rule's own numbers


def test_an_unwritable_html_path_is_one_line(tmp_path, capfd):
    assert main(ARGS + ["--max-new-tokens", "3", "--html", str(tmp_path / "no" / "such" / "dir.html")]) == 1
    err = capfd.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("npspec.generate: error: cannot write --html ") and "pick a writable path" in err


# --- a real browser (slow) ------------------------------------------------------------------------------

BROWSERS = ("chromium", "chromium-browser", "chromium-headless-shell", "google-chrome", "chrome")


def png_pixels(path):
    """(width, height, the decompressed scanlines) of a PNG file: enough to tell a blank image from a drawn one."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, size = 8, b"", None
    while pos < len(data):
        n, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + n]
        if kind == b"IHDR":
            size = struct.unpack(">II", body[:8])
        elif kind == b"IDAT":
            idat += body
        pos += 12 + n
    return size[0], size[1], zlib.decompress(idat)


@pytest.mark.slow
def test_a_browser_renders_the_page(tmp_path):
    browser = next((shutil.which(b) for b in BROWSERS if shutil.which(b)), None)
    if browser is None:
        pytest.skip(f"no Chromium on PATH (looked for {', '.join(BROWSERS)}); apt-get install chromium to run it")
    page = picture.write(tmp_path / "round.html", ROUNDS, decode, prompt="P:")
    shot = tmp_path / "shot.png"
    r = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                        f"--screenshot={shot}", "--window-size=900,500", page.as_uri()],
                       capture_output=True, text=True, timeout=120)
    assert shot.is_file(), r.stderr
    width, height, scanlines = png_pixels(shot)
    assert (width, height) == (900, 500)
    assert len(set(scanlines)) > 16  # many distinct byte values: text and colours were drawn, not a blank page
