"""The grown-parameter memory benchmark (eval/bench/grow_param_peak.py) runs each case in its own process and
records, per parameter, the peak bytes per grown element; nothing here asserts a memory size."""

from __future__ import annotations

import json

from growlm.eval.bench import grow_param_peak as bench


def test_each_case_records_its_largest_parameters(tmp_path, capsys):
    out = tmp_path / "peak.json"
    assert bench.main(["--cases", "depth x2", "width x2, noise", "--out", str(out)]) == 0
    rows = json.loads(out.read_text())
    assert [r["case"] for r in rows] == ["depth x2", "width x2, noise"]
    for r in rows:
        assert len(r["params"]) == 2 and r["max_bytes_per_element"] == max(
            p["peak_bytes_per_element"] for p in r["params"]
        )
        assert all(p["grown_numel"] >= 10**6 and p["peak_bytes_per_element"] > 0 for p in r["params"])
    names = {p["param"] for p in rows[1]["params"]}
    assert names == {"transformer.wte.weight", "transformer.h.0.mlp.c_fc.weight"}  # the two largest grown ones
    assert "bytes per grown element at the peak" in capsys.readouterr().out
