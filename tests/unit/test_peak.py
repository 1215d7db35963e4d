"""The peak MFU is measured against (eval/bench/peak.py): GPUs by their exact device name, datasheet figures, and no
peak (MFU null, one warning) for a name the table does not know."""

from __future__ import annotations

import pytest
import torch

from growlm.eval.bench import peak
from growlm.eval.bench.peak import GPU_PEAKS, Peak, device_peak, format_mfu, gpu_table_peak

# torch.cuda.get_device_name() -> dense TFLOP/s (bf16, fp16, tf32, plain fp32) from the vendors' datasheets; the
# Hopper datasheets give tensor-core figures with sparsity only, halved here (e.g. H100 PCIe bf16 1,513 / 2)
EXPECTED = {
    "NVIDIA H100 80GB HBM3": (989.5, 989.5, 494.5, 67.0),  # H100 SXM
    "NVIDIA H100 PCIe": (756.5, 756.5, 378.0, 51.0),
    "NVIDIA H100 NVL": (835.5, 835.5, 417.5, 60.0),
    "NVIDIA H200": (989.5, 989.5, 494.5, 67.0),  # H200 SXM, 141 GB
    "NVIDIA H200 NVL": (835.5, 835.5, 417.5, 60.0),
    "NVIDIA A100-SXM4-40GB": (312.0, 312.0, 156.0, 19.5),
    "NVIDIA A100-SXM4-80GB": (312.0, 312.0, 156.0, 19.5),
    "NVIDIA A100-PCIE-40GB": (312.0, 312.0, 156.0, 19.5),
    "NVIDIA A100 80GB PCIe": (312.0, 312.0, 156.0, 19.5),
    "NVIDIA L40S": (362.05, 362.05, 183.0, 91.6),
}
DATASHEETS = {"H100": "NVIDIA H100 Tensor Core GPU datasheet", "H200": "NVIDIA H200 Tensor Core GPU datasheet",
              "A100": "NVIDIA A100 Tensor Core GPU datasheet", "L40S": "NVIDIA L40S datasheet"}  # fmt: skip


@pytest.fixture(autouse=True)
def fresh_warnings(monkeypatch):
    """Each test starts as a fresh process would: no device warned about yet."""
    monkeypatch.setattr(peak, "_warned", set())


@pytest.mark.parametrize("name", EXPECTED)
def test_each_listed_gpu_gets_its_own_datasheet_figures(name):
    for precision, tflops in zip(("bf16", "fp16", "tf32", "fp32"), EXPECTED[name], strict=True):
        p = gpu_table_peak(name, precision)
        assert p.flops_per_s == tflops * 1e12, (name, precision, p)
        family = next(k for k in DATASHEETS if k in name)
        assert DATASHEETS[family] in p.source and f"{tflops:g} TFLOP/s" in p.source, p.source
        assert GPU_PEAKS[name].part in p.source
    assert set(GPU_PEAKS) == set(EXPECTED)


def test_pcie_and_nvl_parts_do_not_get_the_sxm_figure():
    sxm = gpu_table_peak("NVIDIA H100 80GB HBM3", "bf16").flops_per_s
    assert sxm == 989.5e12
    assert gpu_table_peak("NVIDIA H100 PCIe", "bf16").flops_per_s == 756.5e12  # 24% below the SXM part
    assert gpu_table_peak("NVIDIA H100 NVL", "fp16").flops_per_s == 835.5e12
    assert gpu_table_peak("NVIDIA H200 NVL", "bf16").flops_per_s == 835.5e12
    for name in ("NVIDIA H100 PCIe", "NVIDIA H100 NVL", "NVIDIA H200 NVL"):
        assert gpu_table_peak(name, "bf16").flops_per_s < sxm


def test_an_fp32_run_is_measured_against_plain_fp32_not_tf32():
    p = gpu_table_peak("NVIDIA H100 PCIe", "fp32")
    assert p.flops_per_s == 51e12 and "plain fp32" in p.source and "TF32 off" in p.source
    assert gpu_table_peak("NVIDIA H100 PCIe", "tf32").flops_per_s == 378e12


def test_an_unknown_name_gets_no_peak_and_one_warning(capsys):
    # a substring of a known name, a known name plus more (a MIG slice has a fraction of the GPU), another GPU
    for name in ("NVIDIA H100", "NVIDIA A100-SXM4-40GB MIG 1g.5gb", "Tesla T4"):
        assert [gpu_table_peak(name, p) for p in ("bf16", "fp16", "fp32")] == [None, None, None]
        err = capsys.readouterr().err
        assert err.count("warning") == 1, err  # once per process, however often it is asked
        assert repr(name) in err and "--peak_tflops" in err and "MFU is left empty" in err


def test_device_peak_on_an_unknown_gpu_gives_no_mfu(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.delenv("DS_ACCELERATOR", raising=False)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=0: "NVIDIA B200")
    peaks = [device_peak(p, threads=1) for p in ("bf16", "fp16")]
    assert [p.flops_per_s for p in peaks] == [None, None]
    assert peaks[0].mfu(1e12) is None and "NVIDIA B200" in peaks[0].source
    assert capsys.readouterr().err.count("warning") == 1
    # a given peak wins; a known GPU gets its table figure
    assert device_peak("bf16", 1, peak_tflops=2250.0).mfu(450e12) == pytest.approx(0.2)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=0: "NVIDIA H100 PCIe")
    assert device_peak("bf16", 1).mfu(75.65e12) == pytest.approx(0.1)
    assert capsys.readouterr().err == ""
    # a CPU run on a GPU node (DS_ACCELERATOR=cpu) is measured against the CPU, not the GPU's datasheet
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    assert device_peak("fp32", 1).source.startswith("measured:")


def test_mfu_and_its_format():
    assert Peak(200e12, "x").mfu(50e12) == 0.25
    assert Peak(None, "unknown").mfu(50e12) is None
    assert format_mfu(0.1234) == "12.3%" and format_mfu(None) == "n/a"
