"""growlm-prepare --tokenizer of a folder whose tokenizer puts a bos token before each text (TinyLlama's ``<s> $A``
template): every document of the token files starts with ``<s>`` (id 1) as in the model's pretraining, meta.json
records the folder's bos/eos/unk, the token folder's tokenizer reads them back, and the tokenizer files an export
writes name the same tokens and encode exactly as the source folder (``<s>`` first). A folder that switches the bos
off (tokenizer_config.json ``add_bos_token: false``), a folder without a template and GPT-2 data get no bos."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from bos_folder_helpers import write_bos_tokenizer
from llama_folder_helpers import make_llama_folder

from growlm.data import tokenizer as tok
from growlm.data.prepare import main as prepare_main
from growlm.data.tokens import load_meta

DOCS = ["The tempest rose over the island; the sailors cried.\n", "A second document, in plain words: 12345."]
RECORD = {"bos_token": {"token": "<s>", "id": 1}, "eos_token": {"token": "</s>", "id": 2},
          "unk_token": {"token": "<unk>", "id": 0}}  # fmt: skip


def prepare(tmp_path: Path, folder: Path) -> Path:
    paths = []
    for i, text in enumerate(DOCS):
        (tmp_path / f"doc{i}.txt").write_text(text)
        paths.append(str(tmp_path / f"doc{i}.txt"))
    out = tmp_path / "tokens"
    assert prepare_main(["--train", *paths, "--val", paths[0], "--out", str(out), "--tokenizer", str(folder)]) == 0
    return out


def source_ids(folder: Path, text: str) -> list[int]:
    """What transformers' AutoTokenizer of ``folder`` gives for ``text`` (special tokens added, as in training)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(folder))(text)["input_ids"]


def test_documents_start_with_the_folders_bos_and_meta_records_its_special_tokens(tmp_path):
    folder = write_bos_tokenizer(tmp_path / "model")
    assert source_ids(folder, DOCS[0])[0] == 1  # the source itself puts <s> first
    out = prepare(tmp_path, folder)
    meta = load_meta(out)
    assert meta["special_tokens"] == RECORD and meta["add_bos_token"] is True
    assert (meta["eot_token"], meta["eot_token_id"]) == ("</s>", 2)
    want = [i for text in DOCS for i in [*source_ids(folder, text), 2]]  # each document: <s> ... </s>
    assert want[0] == 1 and want.count(1) == 2
    assert np.fromfile(out / "train.bin", dtype="<u2").tolist() == want
    assert meta["splits"]["train"]["n_tokens"] == len(want)

    back = tok.from_data_dir(out)  # what the export reads
    assert (back.special_tokens, back.add_bos_token, back.bos_token_id) == (
        (("bos_token", "<s>", 1), ("eos_token", "</s>", 2), ("unk_token", "<unk>", 0)),
        True,
        1,
    )
    hf = tmp_path / "hf"
    hf.mkdir()
    back.save_hf(hf, model_max_length=64)
    config = json.loads((hf / "tokenizer_config.json").read_text())
    assert (config["bos_token"], config["eos_token"], config["unk_token"]) == ("<s>", "</s>", "<unk>")
    assert "add_bos_token" not in config  # the copied template already adds <s>
    for text in DOCS:
        assert source_ids(hf, text) == source_ids(folder, text)

    meta["special_tokens"]["bos_token"]["id"] = 2  # a damaged record is refused, not trusted
    (out / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(tok.TokenizerError, match="special_tokens.bos_token"):
        tok.from_data_dir(out)


@pytest.mark.parametrize(
    ("add_bos_token", "post_processor", "bos_first"),
    [(False, True, True), (True, False, True), (None, False, False), (False, False, False)],
)
def test_the_template_decides_and_add_bos_token_only_without_a_post_processor(
    tmp_path, add_bos_token, post_processor, bos_first
):
    """tokenizer.json's post-processor is what transformers' fast tokenizer applies, whatever tokenizer_config.json's
    add_bos_token says (its template adds <s> even with add_bos_token false); a tokenizer.json without any
    post-processor takes add_bos_token. Either way the export's tokenizer.json puts <s> first exactly when the token
    files do."""
    folder = write_bos_tokenizer(tmp_path / "model", add_bos_token=add_bos_token)
    if not post_processor:
        spec = json.loads((folder / "tokenizer.json").read_text())
        (folder / "tokenizer.json").write_text(json.dumps(spec | {"post_processor": None}))
    out = prepare(tmp_path, folder)
    meta = load_meta(out)
    assert meta["special_tokens"] == RECORD and meta["add_bos_token"] is bos_first
    text_ids = [tok.from_hf_dir(folder).encode(text) for text in DOCS]
    want = [i for ids in text_ids for i in [*([1] if bos_first else []), *ids, 2]]
    assert np.fromfile(out / "train.bin", dtype="<u2").tolist() == want
    hf = tmp_path / "hf"
    hf.mkdir()
    tok.from_data_dir(out).save_hf(hf, model_max_length=64)
    for text, ids in zip(DOCS, text_ids, strict=True):
        assert source_ids(hf, text) == [*([1] if bos_first else []), *ids]
    if post_processor:  # transformers itself agrees with the token files
        assert source_ids(folder, DOCS[0]) == [1, *text_ids[0]]


def test_a_folder_without_a_bos_template_adds_none_but_records_its_tokens(tmp_path):
    folder = make_llama_folder(tmp_path / "model")  # ByteLevel post-processor: <s>=0, </s>=1, <unk>=2, no template
    out = prepare(tmp_path, folder)
    meta = load_meta(out)
    assert meta["add_bos_token"] is False
    assert meta["special_tokens"] == {"bos_token": {"token": "<s>", "id": 0}, "eos_token": {"token": "</s>", "id": 1},
                                      "unk_token": {"token": "<unk>", "id": 2}}  # fmt: skip
    model_tok = tok.from_hf_dir(folder)
    assert np.fromfile(out / "train.bin", dtype="<u2").tolist() == [i for t in DOCS for i in [*model_tok.encode(t), 1]]


@pytest.mark.bad_input
def test_a_folder_asking_for_a_bos_it_does_not_have_is_refused(tmp_path, capsys):
    folder = write_bos_tokenizer(tmp_path / "model", add_bos_token=True)
    cfg = json.loads((folder / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps(cfg | {"bos_token": "<bos>"}))
    assert "the bos_token '<bos>' is not a token of tokenizer.json" in _prepare_refused(tmp_path, capsys, folder)


def test_gpt2_and_plain_tokenizer_files_declare_no_special_tokens(tmp_path):
    """GPT-2 data keeps <|endoftext|> as bos, eos and unk of the export (as before)."""
    t = tok.gpt2()
    assert (t.special_tokens, t.add_bos_token, t.bos_token_id) == ((), False, None)
    t.save_hf(tmp_path, model_max_length=64)
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    assert {config[k] for k in ("bos_token", "eos_token", "unk_token")} == {"<|endoftext|>"}
    assert "add_bos_token" not in config


def test_gpt2_family_export_takes_the_recorded_bos_id():
    """growlm-grow --export_hf's conversion writes the bos id into config.json and generation_config.json of either
    family; GPT-2 data (no record) keeps the end-of-text id as both."""
    from growlm.growth.offline.export import to_transformers
    from growlm.model.config import GPTConfig
    from growlm.model.gpt2.model import GPT

    model = GPT(GPTConfig(n_layer=1, n_embd=32, n_head=2, n_positions=16, vocab_size=64, dropout=0.0))
    hf = to_transformers(model, 2, 1)
    assert (hf.config.bos_token_id, hf.config.eos_token_id) == (1, 2)
    assert (hf.generation_config.bos_token_id, hf.generation_config.eos_token_id) == (1, 2)
    hf = to_transformers(model, 63)
    assert (hf.config.bos_token_id, hf.config.eos_token_id, hf.generation_config.bos_token_id) == (63, 63, 63)


def test_ids_only_config_json_names_are_recorded_when_they_are_tokens(tmp_path):
    """A folder whose tokenizer files name only the eos: bos and pad come from config.json's ids, recorded when
    tokenizer.json has them (a pad id beyond it names nothing and is left out)."""
    folder = write_bos_tokenizer(tmp_path / "model")
    (folder / "tokenizer_config.json").write_text(json.dumps({"eos_token": "</s>"}))
    (folder / "special_tokens_map.json").unlink(missing_ok=True)
    (folder / "config.json").write_text(json.dumps({"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 999}))
    t = tok.from_hf_dir(folder)
    assert t.special_tokens == (("bos_token", "<s>", 1), ("eos_token", "</s>", 2)) and t.bos_token_id == 1


def _prepare_refused(tmp_path: Path, capsys, folder: Path) -> str:
    docs = [tmp_path / "doc0.txt", tmp_path / "doc1.txt"]
    for path, text in zip(docs, DOCS, strict=True):
        path.write_text(text)
    out = tmp_path / "tokens"
    argv = ["--train", str(docs[0]), "--val", str(docs[1]), "--out", str(out), "--tokenizer", str(folder)]
    assert prepare_main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("growlm-prepare: error: ") and not out.exists(), err
    return err.strip().removeprefix("growlm-prepare: error: ")


@pytest.mark.bad_input
def test_a_template_that_puts_an_unknown_id_first_is_named(tmp_path, capsys):
    """tokenizer.json's template adds an id its vocabulary lacks, and no file names a bos token: the line names the
    template and the id (it used to blame an add_bos_token that no file sets)."""
    folder = write_bos_tokenizer(tmp_path / "model")
    t = json.loads((folder / "tokenizer.json").read_text())
    t["post_processor"]["special_tokens"]["<s>"]["ids"] = [99999]
    (folder / "tokenizer.json").write_text(json.dumps(t))
    for name in ("tokenizer_config.json", "special_tokens_map.json"):
        if (folder / name).is_file():
            cfg = json.loads((folder / name).read_text())
            cfg.pop("bos_token", None)
            (folder / name).write_text(json.dumps(cfg))
    assert _prepare_refused(tmp_path, capsys, folder) == (
        f"{folder}: tokenizer.json's template (its post_processor) puts id 99999 first, which is not a token of its "
        "vocabulary; fix the template or the vocabulary"
    )


@pytest.mark.bad_input
def test_a_tokenizer_config_that_is_not_json_is_named(tmp_path, capsys):
    """A damaged tokenizer_config.json is refused, not ignored (its eos would silently fall back to <|endoftext|>)."""
    folder = write_bos_tokenizer(tmp_path / "model")
    (folder / "tokenizer_config.json").write_text('{"eos_token": "</s>", ')
    line = _prepare_refused(tmp_path, capsys, folder)
    assert line.startswith(f"{folder / 'tokenizer_config.json'} is not valid JSON (") and line.endswith(
        "); restore it, or remove it"
    ), line


def test_growlm_eval_starts_documents_and_cloze_items_from_the_tokenizers_bos(tmp_path):
    """Where the tokenizer puts a bos token before each text, growlm-eval scores every document and cloze item from
    it (as the model saw its training documents), not from end-of-text; a tokenizer without one starts from
    end-of-text as before."""
    import torch

    from growlm.eval.metrics.cli import perplexity_of, start_token
    from growlm.eval.metrics.cloze import ClozeItem, score_cloze
    from growlm.eval.metrics.load import LoadedModel
    from growlm.model.config import from_preset

    seen: list[torch.Tensor] = []

    def logits(x: torch.Tensor) -> torch.Tensor:
        seen.append(x.clone())
        return torch.zeros(*x.shape, 50_257)

    with_bos, without = tok.from_hf_dir(write_bos_tokenizer(tmp_path / "bos")), tok.gpt2()  # GPT-2 adds no bos
    assert (start_token(with_bos), start_token(without)) == (1, 50_256)
    cfg = from_preset("llama-tiny", vocab_size=50_257)
    for t, first in ((with_bos, 1), (without, 50_256)):
        seen.clear()
        m = LoadedModel(logits, cfg, t, "test", "transformers", torch.nn.Identity())
        perplexity_of(m, {"a": DOCS[0], "b": DOCS[1]}, context=16, stride=16, batch_size=4, progress=False)
        starts = [int(x[i, 0]) for x in seen for i in range(x.shape[0])]
        assert starts[0] == first and starts.count(first) == 2  # each document's first window, from the start token
        seen.clear()
        item = ClozeItem(context=DOCS[0].strip() * 4, target="cried")
        score_cloze(logits, [item], t, context=16)
        assert (int(seen[0][0, 0]) == 1) == (t is with_bos)  # the bos stays first when the context is cut
