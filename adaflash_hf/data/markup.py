"""Plain text out of source formats: Wikipedia markup (:func:`wiki_to_text`) and a novel's wrapped lines
(:func:`split_chapters`), for the prose corpora of :mod:`adaflash_hf.data.corpora`.
"""

from __future__ import annotations

import html
import re

_WIKI_STOP_SECTIONS = re.compile(
    r"^(see also|references|notes|external links|further reading|bibliography|sources|footnotes|citations)$",
    re.IGNORECASE,
)


def _strip_nested(text: str, open_mark: str, close_mark: str) -> str:
    """Remove every (possibly nested) ``open_mark … close_mark`` span; an unclosed one runs to the end."""
    out: list[str] = []
    depth = 0
    i = 0
    while i < len(text):
        if text.startswith(open_mark, i):
            depth += 1
            i += len(open_mark)
        elif depth and text.startswith(close_mark, i):
            depth -= 1
            i += len(close_mark)
        else:
            if not depth:
                out.append(text[i])
            i += 1
    return "".join(out)


_INNER_LINK = re.compile(r"\[\[([^\[\]]*)\]\]")
_DROPPED_LINK = re.compile(r"^\s*(file|image|category|media|[a-z]{2,3}(-[a-z]+)?)\s*:", re.IGNORECASE)


def _resolve_link(match: re.Match[str]) -> str:
    target = match.group(1)
    if _DROPPED_LINK.match(target):
        return ""
    return target.split("|")[-1]


def wiki_to_text(markup: str) -> str:
    """Rough plain text of MediaWiki markup: prose paragraphs, headings kept as lines.

    Drops comments, references, templates, tables, files, categories and interlanguage links;
    keeps link labels, bold/italic text and list items (as ``- item``); stops at the first
    "See also" / "References" / "External links"-type heading.
    """
    text = re.sub(r"<!--.*?-->", "", markup, flags=re.DOTALL)
    text = re.sub(r"<ref[^>]*/>", "", text, flags=re.IGNORECASE)
    text = re.sub(r"<ref[^>]*>.*?</ref>", "", text, flags=re.IGNORECASE | re.DOTALL)
    text = re.sub(r"<(gallery|math|timeline|imagemap|score)[^>]*>.*?</\1>", "", text, flags=re.IGNORECASE | re.DOTALL)
    text = _strip_nested(text, "{{", "}}")
    text = _strip_nested(text, "{|", "|}")
    text = re.sub(r"\[(?:https?:)?//[^\s\]]+\s*([^\]]*)\]", r"\1", text)
    while (resolved := _INNER_LINK.sub(_resolve_link, text)) != text:
        text = resolved
    text = _strip_nested(text, "[[", "]]")  # links left unresolved by stray brackets in captions
    text = re.sub(r"'{2,}", "", text)
    text = re.sub(r"</?[a-zA-Z][^<>]*>", "", text)  # tags only: prose also has "<10 ppm"
    text = re.sub(r"__[A-Z]+__", "", text)
    text = html.unescape(text)

    blocks: list[tuple[bool, str]] = []  # (is_heading, text)
    current: list[str] = []

    def flush() -> None:
        if current:
            blocks.append((False, " ".join(current)))
            current.clear()

    for raw in text.splitlines():
        line = raw.strip()
        heading = re.fullmatch(r"(=+)\s*(.*?)\s*\1", line)
        if heading:
            flush()
            if _WIKI_STOP_SECTIONS.match(heading.group(2)):
                break
            blocks.append((True, heading.group(2)))
        elif not line or line.startswith(("|", "!", "{", "}")):
            flush()
        elif line[0] in "*#;":
            flush()
            blocks.append((False, "- " + line.lstrip("*#;: ").strip()))
        else:
            current.append(line.lstrip(": "))
    flush()

    cleaned: list[tuple[bool, str]] = []
    for is_heading, block in blocks:
        block = re.sub(r"\(\s*[,;]?\s*\)", "", block)
        block = re.sub(r"\s+([,.;:])", r"\1", block)
        block = re.sub(r"\s{2,}", " ", block).strip()
        if block and block != "-":
            cleaned.append((is_heading, block))
    # A heading followed by another heading or by nothing has lost its section's text: drop it.
    kept = [
        block
        for i, (is_heading, block) in enumerate(cleaned)
        if not (is_heading and (i + 1 == len(cleaned) or cleaned[i + 1][0]))
    ]
    return "\n\n".join(kept)


_CHAPTER_HEADING = re.compile(r"^\s*chapter\s+([ivxlc]+|\d+)\.?\s*$", re.IGNORECASE)
_VOLUME_HEADING = re.compile(r"^\s*volume\s+([ivxlc]+|\d+)\.?\s*$", re.IGNORECASE)
_BOOK_END = re.compile(r"^\s*(the end|finis|a note on the text)\s*$", re.IGNORECASE)


def split_chapters(lines: list[str | None]) -> list[str]:
    """Chapters of a novel given as wrapped lines; each chapter is paragraphs joined by blank lines."""
    chapters: list[list[str]] = []
    paragraph: list[str] = []

    def flush() -> None:
        if paragraph and chapters:
            chapters[-1].append(re.sub(r"_([^_]+)_", r"\1", " ".join(paragraph)))
        paragraph.clear()

    for raw in lines:
        line = (raw or "").strip()
        if _BOOK_END.match(line):
            break
        if _CHAPTER_HEADING.match(line):
            flush()
            chapters.append([])
        elif _VOLUME_HEADING.match(line) or not line:
            flush()
        else:
            paragraph.append(line)
    flush()
    return ["\n\n".join(chapter) for chapter in chapters if chapter]
