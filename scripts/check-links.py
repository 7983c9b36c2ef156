#!/usr/bin/env python3
"""Checks the relative links of README.md and docs/**/*.md: each must name a file that exists,
and each #anchor a heading of the page it points to, by mdBook's rules for heading ids.

Usage: scripts/check-links.py [ROOT]   (ROOT defaults to the repository holding this script)

Exit status 0 when every link resolves, 1 otherwise (one line per broken link on stderr:
file:line: what is wrong). Standard library only: there is no internet here.
"""

import html
import re
import sys
import urllib.parse
from pathlib import Path

FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
ATX = re.compile(r"^ {0,3}(#{1,6})(?:[ \t]+(.*?))?(?:[ \t]+#+)?[ \t]*$")
SETEXT = re.compile(r"^ {0,3}(=+|-+)[ \t]*$")
CUSTOM_ID = re.compile(r"\s*\{#([^}\s]+)\}\s*$")
CODE_SPAN = re.compile(r"(`+)(.+?)\1", re.S)
# [text](dest "title") and ![alt](dest); the text may hold one level of brackets.
INLINE_LINK = re.compile(
    r"!?\[(?:[^\[\]\\]|\\.|\[[^\[\]]*\])*\]\(\s*(<[^>\n]*>|[^\s()]+)(?:\s+(?:\"[^\"]*\"|'[^']*'))?\s*\)"
)
REFERENCE_DEF = re.compile(r"^ {0,3}\[[^\]]+\]:\s*(<[^>]*>|\S+)")
SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")
INLINE_LINK_TEXT = re.compile(r"!?\[((?:[^\[\]\\]|\\.|\[[^\[\]]*\])*)\]\([^)]*\)")
HTML_TAG = re.compile(r"<[^>]+>")


def slug(text):
    """The id mdBook gives a heading whose rendered text is `text` (mdbook-html's
    `id_from_content`): trimmed, lower case, alphanumerics, `_` and `-` kept, whitespace turned
    into `-`, everything else dropped."""
    out = []
    for ch in text.strip().lower():
        if ch.isalnum() or ch in "_-":
            out.append(ch)
        elif ch.isspace():
            out.append("-")
    return "".join(out)


def heading_text(source):
    """The text a heading's Markdown renders to: code spans keep their content, links keep
    their text, emphasis markers, HTML tags and backslash escapes go, entities are decoded."""
    spans = []

    def keep(match):
        code = match.group(2)
        if len(code) > 2 and code.startswith(" ") and code.endswith(" ") and code.strip():
            code = code[1:-1]
        spans.append(code)
        return "\x00%d\x00" % (len(spans) - 1)

    text = CODE_SPAN.sub(keep, source)
    text = INLINE_LINK_TEXT.sub(lambda m: m.group(1), text)
    text = HTML_TAG.sub("", text)
    text = re.sub(r"\*+", "", text)
    text = re.sub(r"(?<![A-Za-z0-9])_+|_+(?![A-Za-z0-9])", "", text)
    text = re.sub(r"\\([!-/:-@\[-`{-~])", r"\1", text)
    text = html.unescape(text)
    return re.sub("\x00(\\d+)\x00", lambda m: spans[int(m.group(1))], text)


def unique(ids):
    """mdBook's `unique_id` over one page's headings in order: a repeated id gets -1, -2..."""
    used = set()
    out = []
    for wanted in ids:
        candidate, n = wanted, 0
        while candidate in used:
            n += 1
            candidate = "%s-%d" % (wanted, n)
        used.add(candidate)
        out.append(candidate)
    return out


def prose_lines(text):
    """(line number, line) for every line outside fenced code blocks."""
    fence = None
    for number, line in enumerate(text.splitlines(), 1):
        match = FENCE.match(line)
        if fence:
            if match and match.group(1)[0] == fence[0] and len(match.group(1)) >= len(fence):
                fence = None
            continue
        if match:
            fence = match.group(1)
            continue
        yield number, line


def anchors(text):
    """The ids of a page's headings (ATX and setext), as mdBook renders them."""
    ids = []
    previous = None
    for _, line in prose_lines(text):
        atx = ATX.match(line)
        if atx:
            ids.append(heading_id(atx.group(2) or ""))
            previous = None
            continue
        if previous and previous.strip() and SETEXT.match(line):
            ids.append(heading_id(previous.strip()))
            previous = None
            continue
        previous = line
    return set(unique(ids))


def heading_id(source):
    custom = CUSTOM_ID.search(source)
    if custom:
        return custom.group(1)
    return slug(heading_text(source))


def links(text):
    """(line number, destination) for every inline link, image and reference definition
    outside code."""
    for number, line in prose_lines(text):
        # Code spans are not links; blank them out, keeping the columns.
        line = CODE_SPAN.sub(lambda m: " " * len(m.group(0)), line)
        for match in INLINE_LINK.finditer(line):
            yield number, match.group(1)
        definition = REFERENCE_DEF.match(line)
        if definition:
            yield number, definition.group(1)


def check_file(path, root, anchor_cache):
    problems = []
    text = path.read_text(encoding="utf-8")
    for number, dest in links(text):
        dest = dest[1:-1] if dest.startswith("<") and dest.endswith(">") else dest
        if SCHEME.match(dest) or dest.startswith("//"):
            continue
        target, _, fragment = dest.partition("#")
        target = urllib.parse.unquote(target)
        fragment = urllib.parse.unquote(fragment)
        resolved = (path.parent / target).resolve() if target else path.resolve()
        where = "%s:%d" % (path.relative_to(root), number)
        if not resolved.exists():
            problems.append("%s: %s: no such file" % (where, dest))
            continue
        if not fragment:
            continue
        if resolved.is_dir() or resolved.suffix.lower() != ".md":
            problems.append("%s: %s: an anchor into a file that is not Markdown" % (where, dest))
            continue
        if resolved not in anchor_cache:
            anchor_cache[resolved] = anchors(resolved.read_text(encoding="utf-8"))
        if fragment not in anchor_cache[resolved]:
            problems.append("%s: %s: no heading with id #%s" % (where, dest, fragment))
    return problems


def pages(root):
    """README.md and docs/**/*.md."""
    found = []
    readme = root / "README.md"
    if readme.exists():
        found.append(readme)
    docs = root / "docs"
    if docs.is_dir():
        found.extend(sorted(docs.rglob("*.md")))
    return found


def check(root):
    root = Path(root).resolve()
    cache = {}
    problems = []
    for page in pages(root):
        problems.extend(check_file(page.resolve(), root, cache))
    return problems


def main(argv):
    root = Path(argv[1]) if len(argv) > 1 else Path(__file__).resolve().parent.parent
    problems = check(root)
    for problem in problems:
        print(problem, file=sys.stderr)
    checked = len(pages(Path(root).resolve()))
    if problems:
        print("%d broken link(s) in %d page(s)" % (len(problems), checked), file=sys.stderr)
        return 1
    print("links: %d page(s), every relative link and anchor resolves" % checked)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
