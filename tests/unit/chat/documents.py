"""Documents built in the tests, byte for byte: PDFs (plain or with streams that expand), DOCX,
PPTX and XLSX files, and zip bombs dressed as DOCX."""

from __future__ import annotations

import base64
import io
import zipfile
import zlib
from xml.sax.saxutils import escape

_DOCX_CT = "application/vnd.openxmlformats-officedocument.wordprocessingml.document"


def pdf_of_streams(streams: list[bytes], *, compress: bool = True) -> bytes:
    """A PDF with one page per content stream (Helvetica), with a correct xref table."""
    count = len(streams)
    kids = " ".join(f"{4 + 2 * i} 0 R" for i in range(count))
    objects = [b"<< /Type /Catalog /Pages 2 0 R >>",
               f"<< /Type /Pages /Kids [{kids}] /Count {count} >>".encode(),
               b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>"]
    for i, content in enumerate(streams):
        objects.append(f"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Resources "
                       f"<< /Font << /F1 3 0 R >> >> /Contents {5 + 2 * i} 0 R >>".encode())
        data = zlib.compress(content, 9) if compress else content
        flate = b" /Filter /FlateDecode" if compress else b""
        objects.append(b"<< /Length " + str(len(data)).encode() + flate + b" >>\nstream\n"
                       + data + b"\nendstream")
    out = bytearray(b"%PDF-1.4\n")
    offsets = []
    for number, body in enumerate(objects, start=1):
        offsets.append(len(out))
        out += f"{number} 0 obj\n".encode() + body + b"\nendobj\n"
    xref = len(out)
    out += f"xref\n0 {len(objects) + 1}\n0000000000 65535 f \n".encode()
    out += b"".join(f"{offset:010d} 00000 n \n".encode() for offset in offsets)
    out += (f"trailer\n<< /Size {len(objects) + 1} /Root 1 0 R >>\nstartxref\n{xref}\n"
            f"%%EOF\n").encode()
    return bytes(out)


def _pdf_line(text: str) -> bytes:
    safe = text.replace("\\", "\\\\").replace("(", "\\(").replace(")", "\\)")
    return f"BT /F1 10 Tf 40 700 Td ({safe}) Tj ET\n".encode("latin-1")


def pdf(pages: list[list[str]]) -> bytes:
    """A PDF of pages of text lines."""
    return pdf_of_streams([b"".join(_pdf_line(line) for line in page) for page in pages])


def expanding_pdf(decoded_bytes: int) -> bytes:
    """A small PDF whose one page decodes to `decoded_bytes` of text-showing operators (the
    attack: a few KB that expand to megabytes of text)."""
    line = _pdf_line("A" * 90)
    return pdf_of_streams([line * (decoded_bytes // len(line))])


def _zip(parts: dict[str, str | bytes]) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as package:
        for name, body in parts.items():
            package.writestr(name, body)
    return out.getvalue()


def docx(paragraphs: list[str]) -> bytes:
    body = "".join(f'<w:p><w:r><w:t xml:space="preserve">{escape(p)}</w:t></w:r></w:p>'
                   for p in paragraphs)
    return _zip({
        "[Content_Types].xml": f'<Types><Override PartName="/word/document.xml" '
                               f'ContentType="{_DOCX_CT}.main+xml"/></Types>',
        "word/document.xml": '<w:document xmlns:w="http://schemas.openxmlformats.org/'
                             f'wordprocessingml/2006/main"><w:body>{body}</w:body>'
                             '</w:document>'})


def pptx(slides: list[list[str]]) -> bytes:
    parts: dict[str, str | bytes] = {"ppt/presentation.xml": "<p:presentation xmlns:p="
                                     '"http://schemas.openxmlformats.org/presentationml/2006/'
                                     'main"/>'}
    for number, lines in enumerate(slides, start=1):
        paragraphs = "".join(f"<a:p><a:r><a:t>{escape(line)}</a:t></a:r></a:p>"
                             for line in lines)
        parts[f"ppt/slides/slide{number}.xml"] = (
            '<p:sld xmlns:p="http://schemas.openxmlformats.org/presentationml/2006/main" '
            'xmlns:a="http://schemas.openxmlformats.org/drawingml/2006/main"><p:cSld><p:spTree>'
            f"<p:sp><p:txBody>{paragraphs}</p:txBody></p:sp></p:spTree></p:cSld></p:sld>")
    return _zip(parts)


def xlsx(sheets: dict[str, list[list[str | int]]]) -> bytes:
    """Strings as shared strings, numbers as values."""
    main = 'xmlns="http://schemas.openxmlformats.org/spreadsheetml/2006/main"'
    rel = 'xmlns:r="http://schemas.openxmlformats.org/officeDocument/2006/relationships"'
    shared: list[str] = []
    parts: dict[str, str | bytes] = {}
    entries, rels = [], []
    for number, (name, rows) in enumerate(sheets.items(), start=1):
        xml_rows = []
        for row in rows:
            cells = []
            for value in row:
                if isinstance(value, str):
                    shared.append(value)
                    cells.append(f'<c t="s"><v>{len(shared) - 1}</v></c>')
                else:
                    cells.append(f"<c><v>{value}</v></c>")
            xml_rows.append(f"<row>{''.join(cells)}</row>")
        parts[f"xl/worksheets/sheet{number}.xml"] = (
            f"<worksheet {main}><sheetData>{''.join(xml_rows)}</sheetData></worksheet>")
        entries.append(f'<sheet name="{escape(name)}" sheetId="{number}" r:id="rId{number}"/>')
        rels.append(f'<Relationship Id="rId{number}" Target="worksheets/sheet{number}.xml"/>')
    parts["xl/workbook.xml"] = f"<workbook {main} {rel}><sheets>{''.join(entries)}</sheets>" \
                               "</workbook>"
    parts["xl/_rels/workbook.xml.rels"] = (
        '<Relationships xmlns="http://schemas.openxmlformats.org/package/2006/relationships">'
        f"{''.join(rels)}</Relationships>")
    parts["xl/sharedStrings.xml"] = f"<sst {main}>" + "".join(
        f"<si><t>{escape(s)}</t></si>" for s in shared) + "</sst>"
    return _zip(parts)


def zip_bomb_docx(expanded_bytes: int) -> bytes:
    """A DOCX whose document part really expands to `expanded_bytes` (spaces compress about
    a thousand to one)."""
    head = ('<w:document xmlns:w="http://schemas.openxmlformats.org/wordprocessingml/2006/'
            'main"><w:body><w:p><w:r><w:t>')
    return _zip({"word/document.xml": head + " " * expanded_bytes + "</w:t></w:r></w:p>"
                                                                   "</w:body></w:document>"})


def lying_docx(paragraph: str, padding: int) -> bytes:
    """A DOCX whose document part is `padding` bytes longer than its declared size."""
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as package:
        package.writestr("word/document.xml", '<w:document xmlns:w="http://schemas.'
                         'openxmlformats.org/wordprocessingml/2006/main"><w:body><w:p><w:r>'
                         f"<w:t>{paragraph}</w:t></w:r></w:p></w:body></w:document>"
                         + " " * padding)
        package.filelist[-1].file_size = 64  # the central directory now understates it
    return out.getvalue()


def entity_bomb_docx(encoding: str = "UTF-8") -> bytes:
    """A DOCX whose document part declares nested entities (the billion laughs), written in
    `encoding` (UTF-16 hides `<!DOCTYPE` from a search of the bytes); UTF-16 without a
    byte-order mark when the name gives the byte order (UTF-16BE, UTF-16LE)."""
    entities = '<!ENTITY a "ha">' + "".join(
        f'<!ENTITY {chr(98 + i)} "{("&" + chr(97 + i) + ";") * 10}">' for i in range(8))
    return _zip({"word/document.xml": (
        f'<?xml version="1.0" encoding="{encoding}"?>'
        f"<!DOCTYPE w:document [{entities}]>"
        '<w:document xmlns:w="http://schemas.openxmlformats.org/wordprocessingml/'
        '2006/main"><w:body><w:p><w:r><w:t>&i;</w:t></w:r></w:p></w:body>'
        "</w:document>").encode(encoding)})


def utf16_docx(paragraph: str) -> bytes:
    """A well-formed DOCX whose document part is UTF-16 (with its byte-order mark)."""
    return _zip({"word/document.xml": (
        '<?xml version="1.0" encoding="UTF-16"?>'
        '<w:document xmlns:w="http://schemas.openxmlformats.org/wordprocessingml/2006/main">'
        f'<w:body><w:p><w:r><w:t xml:space="preserve">{escape(paragraph)}</w:t></w:r></w:p>'
        "</w:body></w:document>").encode("utf-16")})


def data_url(data: bytes, media_type: str) -> str:
    return f"data:{media_type};base64,{base64.b64encode(data).decode()}"


PDF_TYPE = "application/pdf"
DOCX_TYPE = _DOCX_CT
PPTX_TYPE = "application/vnd.openxmlformats-officedocument.presentationml.presentation"
XLSX_TYPE = "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet"
