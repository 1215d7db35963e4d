"""A checkpoint's check scales with the ranks: on 4 real gloo ranks (eval/bench/checkpoint_io.py, --small), each rank
hashes on save and checks on resume only its own files and its part of the shared ones, by byte counts (psutil
read_chars, Linux rchar), never the other ranks' shards; a damaged shard is refused on every rank."""

from __future__ import annotations

import json

from growlm.eval.bench import checkpoint_io

SLACK = 256 * 1024  # reads besides the files: the manifest, zip headers of the memory-mapped pickle checks, /proc


def test_each_rank_reads_its_own_files_plus_the_shared_ones(tmp_path, monkeypatch):
    monkeypatch.setenv("GROWLM_STRICT_COLLECTIVES", "1")
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    out = tmp_path / "rows.json"
    argv = ["--small", "--ranks", "4", "--damage", "3", "--out", str(out), "--work", str(tmp_path)]
    assert checkpoint_io.main(argv) == 0
    rows = json.loads(out.read_text())
    assert [r["rank"] for r in rows] == [0, 1, 2, 3] and {r["world_size"] for r in rows} == {4}
    total = rows[0]["checkpoint_bytes"]
    shares = [r["share_bytes"] for r in rows]
    assert sum(shares) < total  # every file but the manifest, once over all ranks
    for r in rows:
        own, shared = r["own_bytes"], r["shared_bytes"]
        assert own > 0 and shared > 0 and own + shared < total / 2  # the other ranks' shards are most of it
        # resume: the check reads this rank's share (its own files, maybe shared ones) and nothing else
        assert r["share_bytes"] <= r["verify_read_bytes"] <= r["share_bytes"] + SLACK
        assert r["verify_read_bytes"] <= own + shared + SLACK
        assert r["open_read_bytes"] <= SLACK  # before the ranks join: the manifest and the run state only
        # save: each rank reads back (hashes) its share only
        assert r["save_read_bytes"] <= r["share_bytes"] + SLACK
        # the check before: every rank read the whole checkpoint
        assert r["old_verify_read_bytes"] >= total - SLACK
        assert any(f.startswith(f"zero_pp_rank_{r['rank']}_") for f in r["verified"])
        # the damaged shard of rank 3: every rank refuses, naming the file and who found it
        refused = r["damage_refused"]
        assert refused and "zero_pp_rank_3_mp_rank_00_optim_states.pt does not match its sha256" in refused
        assert refused.endswith("(found by rank 3)") == (r["rank"] != 3)
    assert sum(r["verify_read_bytes"] for r in rows) <= total + 4 * SLACK  # the job reads it once
