"""Text of Office Open XML files (DOCX, PPTX, XLSX), read with the standard library alone.

An OOXML file is a zip of XML parts, so it is read as one would read a zip bomb: the member
count and the sizes the central directory declares are checked before anything is expanded
(zipfile never reads a member past its declared size: a member lying about it fails its CRC),
and every part read counts toward one budget of uncompressed bytes. OOXML parts never carry a
DTD, so a part declaring one (entity expansion, external entities) is refused by the XML parser
itself (expat's doctype handler), in whatever encoding the part is written: a search of its
bytes would miss a UTF-16 part. Runs in the extraction worker (chat/extract_worker.py), under
its deadline and memory cap.
"""

from __future__ import annotations

import io
import re
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from xml.etree import ElementTree
from xml.parsers import expat

_W = "{http://schemas.openxmlformats.org/wordprocessingml/2006/main}"
_A = "{http://schemas.openxmlformats.org/drawingml/2006/main}"
_S = "{http://schemas.openxmlformats.org/spreadsheetml/2006/main}"
_R = "{http://schemas.openxmlformats.org/officeDocument/2006/relationships}"
_REL = "{http://schemas.openxmlformats.org/package/2006/relationships}"
_NUMBER = re.compile(r"(\d+)")
_FEED = 64 * 1024  # bytes handed to the parser at a time


class Refused(Exception):
    """The file is refused: `reason` is `too_large` or `unreadable`; the message is for the
    client."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


@dataclass(frozen=True)
class ZipLimits:
    max_members: int = 2_000
    max_unzipped_bytes: int = 64 * 1024 * 1024


class _Text:
    """Lines of text up to `max_chars`; `full` once the cap is reached."""

    def __init__(self, max_chars: int) -> None:
        self.max_chars = max_chars
        self.lines: list[str] = []
        self.size = 0
        self.full = False

    def add(self, line: str) -> None:
        if self.full or not line:
            return
        room = self.max_chars - self.size
        if len(line) >= room:
            line, self.full = line[:room], True
        self.lines.append(line)
        self.size += len(line) + 1

    def text(self) -> str:
        return "\n".join(self.lines)


class _Package:
    """The zip, checked as a whole before any part is expanded; parts read within budget."""

    def __init__(self, data: bytes, limits: ZipLimits) -> None:
        try:
            self.zip = zipfile.ZipFile(io.BytesIO(data))
        except (zipfile.BadZipFile, ValueError) as exc:
            raise Refused("unreadable", "the file is not a valid DOCX, PPTX or XLSX "
                                        "(zip) file") from exc
        infos = self.zip.infolist()
        mb = limits.max_unzipped_bytes // (1024 * 1024)
        if len(infos) > limits.max_members:
            raise Refused("too_large", f"the file holds more than {limits.max_members} parts")
        if sum(info.file_size for info in infos) > limits.max_unzipped_bytes:
            raise Refused("too_large", f"the file unpacks to more than {mb} MB")
        self.names = {info.filename for info in infos}
        self.budget = limits.max_unzipped_bytes

    def xml(self, name: str) -> Iterator[tuple[str, ElementTree.Element]]:
        """`iterparse` end events of one part, its declared size within the budget."""
        try:
            info = self.zip.getinfo(name)
            if info.file_size > self.budget:
                raise Refused("too_large", "the file unpacks to more than its budget")
            with self.zip.open(info) as member:
                body = member.read(info.file_size + 1)
        except KeyError as exc:
            raise Refused("unreadable", f"the file has no part {name}") from exc
        except (zipfile.BadZipFile, OSError, EOFError, NotImplementedError) as exc:
            raise Refused("unreadable", f"the part {name} could not be unpacked") from exc
        self.budget -= len(body)
        for element in _elements(body, name):
            yield "end", element

    def numbered(self, prefix: str) -> list[str]:
        """Parts `prefix<N>.xml` in the order of N (slides)."""
        found = [n for n in self.names if n.startswith(prefix) and n.endswith(".xml")
                 and "/" not in n[len(prefix):]]
        return sorted(found, key=lambda n: int(m.group(1)) if (m := _NUMBER.search(
            n[len(prefix):])) else 0)


def _qualified(name: str) -> str:
    """expat's `uri}local` as ElementTree's `{uri}local`."""
    return "{" + name if "}" in name else name


def _elements(body: bytes, part: str) -> Iterator[ElementTree.Element]:
    """Each element of the XML `body` as it ends (what `iterparse`'s end events give), parsed
    by expat with any DTD refused as the parser meets it."""
    parser = expat.ParserCreate(namespace_separator="}")
    builder = ElementTree.TreeBuilder()
    ended: list[ElementTree.Element] = []

    def refuse_dtd(*_: object) -> None:
        raise Refused("unreadable", f"the part {part} declares a DTD, which OOXML never does")

    parser.StartDoctypeDeclHandler = refuse_dtd
    parser.EntityDeclHandler = refuse_dtd  # only ever inside a DTD: refused all the same
    parser.SetParamEntityParsing(expat.XML_PARAM_ENTITY_PARSING_NEVER)
    parser.StartElementHandler = lambda tag, attributes: builder.start(
        _qualified(tag), {_qualified(k): v for k, v in attributes.items()})
    parser.EndElementHandler = lambda tag: ended.append(builder.end(_qualified(tag)))
    parser.CharacterDataHandler = builder.data
    parser.buffer_text = True
    try:
        for start in range(0, len(body) or 1, _FEED):
            parser.Parse(body[start:start + _FEED], False)
            yield from ended
            ended.clear()
        parser.Parse(b"", True)
    except (expat.ExpatError, ValueError, LookupError) as exc:  # or in an unknown encoding
        raise Refused("unreadable", f"the part {part} is not well-formed XML") from exc
    yield from ended


def _docx(package: _Package, out: _Text) -> None:
    for _, element in package.xml("word/document.xml"):
        if out.full:
            return
        if element.tag == f"{_W}p":
            pieces = []
            for node in element.iter():
                if node.tag == f"{_W}t":
                    pieces.append(node.text or "")
                elif node.tag == f"{_W}tab":
                    pieces.append("\t")
                elif node.tag in (f"{_W}br", f"{_W}cr"):
                    pieces.append("\n")
            out.add("".join(pieces))
            element.clear()


def _pptx(package: _Package, out: _Text) -> None:
    for number, name in enumerate(package.numbered("ppt/slides/slide"), start=1):
        out.add(f"Slide {number}:")
        for _, element in package.xml(name):
            if out.full:
                return
            if element.tag == f"{_A}p":
                out.add("".join(t.text or "" for t in element.iter(f"{_A}t")))
                element.clear()


def _shared_strings(package: _Package) -> list[str]:
    if "xl/sharedStrings.xml" not in package.names:
        return []
    strings = []
    for _, element in package.xml("xl/sharedStrings.xml"):
        if element.tag == f"{_S}si":
            strings.append("".join(t.text or "" for t in element.iter(f"{_S}t")))
            element.clear()
    return strings


def _sheets(package: _Package) -> list[tuple[str, str]]:
    """(sheet name, part name) in the workbook's order."""
    targets = {}
    if "xl/_rels/workbook.xml.rels" in package.names:
        for _, element in package.xml("xl/_rels/workbook.xml.rels"):
            if element.tag == f"{_REL}Relationship":
                target = element.get("Target", "").lstrip("/")
                targets[element.get("Id")] = target if target.startswith("xl/") \
                    else f"xl/{target}"
    sheets = []
    for _, element in package.xml("xl/workbook.xml"):
        if element.tag == f"{_S}sheet":
            part = targets.get(element.get(f"{_R}id"))
            if part in package.names:
                sheets.append((element.get("name", ""), part))
    return sheets


def _cell(cell: ElementTree.Element, shared: list[str]) -> str:
    kind = cell.get("t")
    if kind == "inlineStr":
        return "".join(t.text or "" for t in cell.iter(f"{_S}t"))
    value = cell.find(f"{_S}v")
    text = value.text if value is not None and value.text else ""
    if kind == "s":
        index = int(text) if text.isdigit() else -1
        return shared[index] if 0 <= index < len(shared) else ""
    if kind == "b":
        return "TRUE" if text == "1" else "FALSE"
    return text


def _xlsx(package: _Package, out: _Text) -> None:
    shared = _shared_strings(package)
    for name, part in _sheets(package):
        out.add(f"Sheet {name}:")
        for _, element in package.xml(part):
            if out.full:
                return
            if element.tag == f"{_S}row":
                cells = [_cell(c, shared) for c in element.iter(f"{_S}c")]
                out.add("\t".join(cells).rstrip("\t"))
                element.clear()


def ooxml_text(data: bytes, max_chars: int, limits: ZipLimits) -> tuple[str, bool]:
    """(text, whether it was cut at `max_chars`) of a DOCX, PPTX or XLSX file, told apart by
    its parts."""
    package = _Package(data, limits)
    out = _Text(max_chars)
    if "word/document.xml" in package.names:
        _docx(package, out)
    elif "ppt/presentation.xml" in package.names:
        _pptx(package, out)
    elif "xl/workbook.xml" in package.names:
        _xlsx(package, out)
    else:
        raise Refused("unreadable", "the zip file is not a DOCX, PPTX or XLSX document")
    return out.text(), out.full
