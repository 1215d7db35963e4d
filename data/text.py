"""The one reader of user text files: every growlm command that reads a file a user wrote goes through here.

Used by growlm-prepare (.txt[.xz|.gz|.bz2] documents and .jsonl/.json rows), growlm-eval (``--wikitext`` and
``--lambada`` files) and growth plan files (growth/stages/plan.py). The rules are the same everywhere:

* bytes are decoded as strict UTF-8; a leading UTF-8 byte-order mark (EF BB BF) is accepted and removed; a file
  that starts with a UTF-16 byte-order mark is refused with the ``iconv -f utf-16`` fix;
* line endings are normalised to "\\n" (``\\r\\n`` and a lone ``\\r`` both become ``\\n``);
* a problem is an :class:`InputError` whose message is one line, ``FILE:LINE: <problem>; <fix>`` (``FILE: ...``
  when the problem is not on one line): undecodable bytes, a JSON row that is not an object, a row without the
  text field, or a text that is null or not a string. Commands print it after ``<prog>: error:`` and exit 2.

A missing file raises FileNotFoundError (an ``OSError``, as ``open`` does), so callers keep their own wording.
"""

from __future__ import annotations

import bz2
import gzip
import json
import lzma
from collections.abc import Iterator
from pathlib import Path

BOM = b"\xef\xbb\xbf"
_OPENERS = {".xz": lzma.open, ".gz": gzip.open, ".bz2": bz2.open}
UTF8_FIX = "convert it to UTF-8, e.g. `iconv -f latin1 -t utf-8 FILE > FILE.utf8`"
UTF16_BOMS = {b"\xff\xfe": "UTF-16 little-endian", b"\xfe\xff": "UTF-16 big-endian"}  # also UTF-32 LE's first 2
UTF16_FIX = "convert it to UTF-8, e.g. `iconv -f utf-16 -t utf-8 FILE > FILE.utf8`"


class InputError(ValueError):
    """A user file that cannot be used; ``str(err)`` is one line ``FILE:LINE: problem; fix``.

    Attributes: ``path`` (the file), ``line`` (1-based line number, or None when the whole file is at fault),
    ``problem`` and ``fix`` (the two halves of the message).
    """

    def __init__(self, path: str | Path, line: int | None, problem: str, fix: str):
        self.path, self.line, self.problem, self.fix = str(path), line, problem, fix
        where = f"{self.path}:{line}" if line is not None else self.path
        super().__init__(f"{where}: {problem}; {fix}")


def _read_bytes(path: Path) -> bytes:
    """The file's bytes, decompressed when its suffix is .xz / .gz / .bz2.

    Raises:
        FileNotFoundError: no such file.
        InputError: the compressed stream is damaged.
    """
    opener = _OPENERS.get(path.suffix.lower())
    if opener is None:
        return path.read_bytes()
    try:
        with opener(path, "rb") as f:
            return f.read()
    except (lzma.LZMAError, OSError, EOFError) as e:
        if isinstance(e, FileNotFoundError):
            raise
        raise InputError(
            path, None, f"cannot be decompressed as {path.suffix} ({e})", "check or re-create it"
        ) from None


def decode(data: bytes, path: str | Path, first_line: int = 1) -> str:
    """``data`` as text by the module's rules (strict UTF-8, leading BOM removed, line endings normalised).

    ``first_line`` is the line number of ``data``'s first byte in ``path`` (for messages).

    Raises:
        InputError: undecodable bytes, naming the line of the first bad byte; a UTF-16 file (its byte-order mark),
            with the ``iconv -f utf-16`` fix.
    """
    start = len(BOM) if data.startswith(BOM) and first_line == 1 else 0
    if first_line == 1 and data[:2] in UTF16_BOMS:  # saved as UTF-16 (e.g. by Notepad's "Unicode"): not latin1
        raise InputError(path, 1, f"the file is {UTF16_BOMS[data[:2]]} (it starts with a UTF-16 byte-order mark), "
                         "not UTF-8", UTF16_FIX)  # fmt: skip
    try:
        text = data[start:].decode("utf-8")
    except UnicodeDecodeError as e:
        bad = start + e.start
        line = first_line + data.count(b"\n", 0, bad)
        raise InputError(path, line, f"byte 0x{data[bad]:02x} is not valid UTF-8 ({e.reason})", UTF8_FIX) from None
    return text.replace("\r\n", "\n").replace("\r", "\n")


def read_text(path: str | Path) -> str:
    """A whole user file as one string (compressed .xz/.gz/.bz2 files decompressed first), by the module's rules.

    Raises:
        FileNotFoundError: no such file.
        InputError: undecodable bytes (FILE:LINE) or a damaged compressed stream.
    """
    path = Path(path)
    return decode(_read_bytes(path), path)


def read_lines(path: str | Path) -> Iterator[tuple[int, str]]:
    """(line number, line without its end) for every line of a user file, by the module's rules.

    Raises:
        FileNotFoundError / InputError: as read_text.
    """
    yield from enumerate(read_text(path).split("\n"), start=1)


def _row_text(row: object, path: Path, line: int, field: str, fix: str) -> str:
    """The string at ``row[field]``; InputError naming FILE:LINE when the row is not an object or the field is bad."""
    if not isinstance(row, dict):
        raise InputError(path, line, f"the row is a JSON {type(row).__name__}, not an object", fix)
    if field not in row:
        raise InputError(path, line, f"the row has no field {field!r} (fields: {sorted(row)})", fix)
    text = row[field]
    if not isinstance(text, str):
        what = "null" if text is None else f"a JSON {type(text).__name__}"
        raise InputError(path, line, f"field {field!r} is {what}, not a string", fix)
    return text


def _json_array_rows(text: str, path: Path) -> Iterator[tuple[int, object]]:
    """(line, element) of a file holding one JSON array; InputError naming the line of a syntax error."""
    dec = json.JSONDecoder()
    pos = text.index("[") + 1
    n = len(text)

    def skip(i: int) -> int:
        while i < n and text[i] in " \t\n":
            i += 1
        return i

    pos = skip(pos)
    if pos < n and text[pos] == "]":
        return
    while True:
        try:
            value, end = dec.raw_decode(text, pos)
        except json.JSONDecodeError as e:
            raise InputError(path, e.lineno, f"invalid JSON ({e.msg})", "fix the JSON syntax") from None
        yield text.count("\n", 0, pos) + 1, value
        pos = skip(end)
        if pos < n and text[pos] == ",":
            pos = skip(pos + 1)
            continue
        if pos < n and text[pos] == "]" and not text[pos + 1 :].strip():
            return
        line = text.count("\n", 0, pos) + 1
        raise InputError(path, line, "invalid JSON (expected ',' or a final ']')", "fix the JSON syntax")


def read_json_rows(path: str | Path, field: str, fix: str) -> Iterator[tuple[int, str]]:
    """(line number, text) of every row of a JSON Lines file (one object per line; blank lines skipped) or of a
    JSON file holding one array of objects; the text is each object's ``field``, by the module's rules.

    ``fix`` is the second half of every row-level message (how to repair a row, e.g. which option names the
    field). Rows are read lazily, line by line, for JSON Lines; an array file is read whole.

    Raises:
        FileNotFoundError: no such file.
        InputError: undecodable bytes, invalid JSON, a row that is not an object, a row without ``field``, or a
            null / non-string ``field`` (each naming FILE:LINE).
    """
    path = Path(path)
    data = _read_bytes(path)
    if data.removeprefix(BOM).lstrip().startswith(b"["):
        for line, row in _json_array_rows(decode(data, path), path):
            yield line, _row_text(row, path, line, field, fix)
        return
    for line, raw in enumerate(data.split(b"\n"), start=1):
        text = decode(raw, path, first_line=line).strip()
        if not text:
            continue
        try:
            row = json.loads(text)
        except json.JSONDecodeError as e:
            problem = f"invalid JSON ({e.msg}, column {e.colno})"
            raise InputError(path, line, problem, "each line must be one JSON object") from None
        yield line, _row_text(row, path, line, field, fix)
