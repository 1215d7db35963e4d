"""What growlm-grow's time goes to, kept small: a parameter-shape lookup that does not import torch._dynamo (on the
meta device torch's init functions would, seconds of a command's start), the input manifest hashed on several
threads, and the written files' hashes equal to what is on disk."""

import json
import subprocess
import sys

import pytest
import torch

from growlm.growth.offline.universal import Written
from growlm.growth.ops.rules import param_shapes
from growlm.model.config import GPTConfig, LlamaConfig
from growlm.runtime.manifest import ManifestError, file_sha256, read_manifest, verify_files, write_manifest


def test_param_shapes_initialise_nothing_and_import_no_dynamo():
    code = (
        "import sys, json; from growlm.growth.ops.rules import param_shapes; from growlm.model.config import "
        "from_preset; s = {k: param_shapes(from_preset(k)) for k in ('gpt2', 'llama-tiny')}; "
        "print(json.dumps(['torch._dynamo' in sys.modules, {k: len(v) for k, v in s.items()}]))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    dynamo, counts = json.loads(out.strip().splitlines()[-1])
    assert dynamo is False
    # GPT-2: wte, wpe, ln_f weight and bias, 12 per block; llama-tiny: embedding, final norm, lm_head, 9 per block
    assert counts == {"gpt2": 4 + 12 * 12, "llama-tiny": 3 + 2 * 9}
    # the shapes are those of the initialised model
    for cfg in (GPTConfig(n_layer=2, n_embd=32, n_head=4, vocab_size=50), LlamaConfig(n_layer=1, n_embd=32, n_head=4,
                n_kv_head=2, n_inner=40, vocab_size=50, tie_word_embeddings=False)):  # fmt: skip
        from growlm.model.registry import build_model

        model = build_model(cfg)
        assert param_shapes(cfg) == {k: tuple(p.shape) for k, p in model.named_parameters()}
        assert all(p.std() > 0 for p in model.parameters() if p.dim() == 2)  # initialised: param_shapes restored it


@pytest.mark.parametrize("workers", [1, 3])
def test_manifest_hashed_on_threads_finds_the_damaged_file(tmp_path, workers):
    for i, n in enumerate([10, 5000, 300_000, 7]):
        (tmp_path / f"f{i}.bin").write_bytes(bytes(range(256)) * (n // 256) + b"x" * (n % 256))
    write_manifest(tmp_path)
    files = read_manifest(tmp_path)
    verify_files(tmp_path, files, workers=workers)
    data = bytearray((tmp_path / "f2.bin").read_bytes())
    data[123_456] ^= 1  # same size, other content
    (tmp_path / "f2.bin").write_bytes(bytes(data))
    with pytest.raises(ManifestError, match="f2.bin does not match its sha256"):
        verify_files(tmp_path, files, workers=workers)


def test_written_files_are_hashed_as_they_are_on_disk(tmp_path):
    written = Written(tmp_path)
    tensors = {f"p{i}.pt": torch.randn(1000 * (i + 1)) for i in range(8)}
    for name, t in tensors.items():
        written.save({"param": t}, tmp_path / name)
    written.close()
    assert set(written.hashes) == set(tensors)
    for name, (nbytes, digest) in written.hashes.items():
        assert nbytes == (tmp_path / name).stat().st_size and digest == file_sha256(tmp_path / name)
        assert torch.equal(torch.load(tmp_path / name)["param"], tensors[name])


def test_deepspeed_types_read_as_stand_ins_are_written_back_byte_for_byte(tmp_path):
    from deepspeed.runtime.fp16.loss_scaler import DynamicLossScaler, LossScaler
    from deepspeed.runtime.zero.config import ZeroStageEnum
    from deepspeed.utils.tensor_fragment import fragment_address

    from growlm.runtime.checkpoint import safe_load, save_with_deepspeed_names

    real = {
        "loss_scaler": LossScaler(scale=4.0),
        "dynamic": DynamicLossScaler(2.0**16, 7, min_scale=1.0, delayed_shift=2, consecutive_hysteresis=False),
        "zero_stage": ZeroStageEnum.gradients,
        "stages": [ZeroStageEnum.weights, ZeroStageEnum.gradients],  # the enum's class memoized once
        "mapping": {"w": fragment_address(numel=12, start=3)},
        "param_groups": [{"lr": 0.5, "betas": (0.9, 0.95), "params": [0, 1]}],
        "t": torch.arange(6, dtype=torch.float32),
    }
    (tmp_path / "real").mkdir()
    (tmp_path / "again").mkdir()
    torch.save(real, tmp_path / "real" / "o.pt")  # the same file name: torch.save names the archive after it
    read = safe_load(tmp_path / "real" / "o.pt")
    assert type(read["loss_scaler"]) is not LossScaler and vars(read["loss_scaler"]) == vars(real["loss_scaler"])
    assert vars(read["dynamic"]) == vars(real["dynamic"]) and int(read["zero_stage"]) == 2
    assert (read["mapping"]["w"].numel, read["mapping"]["w"].start) == (12, 3)
    save_with_deepspeed_names(read, tmp_path / "again" / "o.pt")
    assert (tmp_path / "again" / "o.pt").read_bytes() == (tmp_path / "real" / "o.pt").read_bytes()
    with pytest.raises(AttributeError, match="local object"):  # the plain pickler refuses a stand-in
        torch.save(read, tmp_path / "plain.pt")


def test_the_command_imports_neither_torch_nor_deepspeed_to_start_and_reads_without_deepspeed(tmp_path):
    from deepspeed.runtime.zero.config import ZeroStageEnum

    torch.save({"zero_stage": ZeroStageEnum.weights, "t": torch.ones(3)}, tmp_path / "o.pt")
    code = (
        "import sys, json; import growlm.growth.offline.cli; before = sorted(m for m in ('torch', 'deepspeed', "
        "'pydantic') if m in sys.modules); from growlm.runtime.checkpoint import safe_load; "
        f"d = safe_load({str(tmp_path / 'o.pt')!r}); "
        "print(json.dumps([before, 'deepspeed' in sys.modules, int(d['zero_stage']), d['t'].tolist()]))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert json.loads(out.strip().splitlines()[-1]) == [[], False, 3, [1.0, 1.0, 1.0]]


def test_a_manifest_check_started_early_gives_its_verdict_to_the_folder_it_checked(tmp_path):
    from growlm.growth.offline.cli import start_input_check

    tag = tmp_path / "ck" / "global_step3"
    tag.mkdir(parents=True)
    (tag / "a.bin").write_bytes(b"x" * 5000)
    write_manifest(tag)
    (tmp_path / "ck" / "latest").write_text("global_step3")
    check = start_input_check(str(tmp_path / "ck"))
    assert check is not None and check.covers(tag) and not check.covers(tmp_path / "ck")
    assert check.result() is True
    assert start_input_check(str(tmp_path / "nothing")) is None
    (tag / "a.bin").write_bytes(b"y" * 5000)  # same size, other content
    with pytest.raises(ManifestError, match="a.bin does not match its sha256"):
        start_input_check(str(tag)).result()
