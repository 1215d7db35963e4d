"""Checkpoint checks split between ranks (runtime.checkpoint: split_files, share_timeout_s, open_for_resume,
verify_shares; runtime.manifest's per-file checks; runtime.collectives.all_gather_object_within), in one process
over a one-rank gloo group. The 4-rank byte counts: tests/distributed/test_checkpoint_io.py."""

from __future__ import annotations

import json
import pickle
from types import SimpleNamespace

import psutil
import pytest
import torch
import torch.distributed as dist

from growlm.runtime import checkpoint, checkpoint_shares, collectives
from growlm.runtime.manifest import ManifestError, check_sizes, read_manifest, verify_files, write_manifest

ZERO2 = {
    "mp_rank_00_model_states.pt": 400,
    "growlm_state.json": 3,
    "zero_pp_rank_0_mp_rank_00_optim_states.pt": 100,
    "zero_pp_rank_1_mp_rank_00_optim_states.pt": 100,
    "rng_state_rank0.pt": 2,
    "rng_state_rank1.pt": 2,
}


@pytest.fixture(scope="module")
def one_rank_group():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_file_rank_names_the_rank_a_file_belongs_to():
    assert checkpoint_shares.file_rank("zero_pp_rank_12_mp_rank_00_optim_states.pt") == 12
    assert checkpoint_shares.file_rank("zero_pp_rank_3_mp_rank_00_model_states.pt") == 3  # ZeRO-3's module shards
    assert checkpoint_shares.file_rank("rng_state_rank7.pt") == 7
    for shared in ("mp_rank_00_model_states.pt", "growlm_state.json", "zero/h.0.attn.c_attn.weight/fp32.pt"):
        assert checkpoint_shares.file_rank(shared) is None


def test_each_rank_gets_its_own_files_and_a_balanced_part_of_the_shared_ones():
    shares = checkpoint_shares.split_files(ZERO2, 2)
    assert shares == [
        sorted(["mp_rank_00_model_states.pt", "zero_pp_rank_0_mp_rank_00_optim_states.pt", "rng_state_rank0.pt"]),
        sorted(["growlm_state.json", "zero_pp_rank_1_mp_rank_00_optim_states.pt", "rng_state_rank1.pt"]),
    ]
    assert sorted(f for s in shares for f in s) == sorted(ZERO2)  # each file once
    # at 4 ranks of a 2-rank checkpoint's names (another world size): everything is shared, split by size
    shares = checkpoint_shares.split_files(ZERO2, 4, by_name=False)
    loads = [sum(ZERO2[f] for f in s) for s in shares]
    assert sorted(f for s in shares for f in s) == sorted(ZERO2)
    assert max(loads) <= sum(ZERO2.values()) / 4 + max(ZERO2.values())
    assert loads == [400, 100, 100, 7]
    # a file named for a rank beyond the world is shared, not dropped
    assert sorted(f for s in checkpoint_shares.split_files(ZERO2, 1) for f in s) == sorted(ZERO2)
    # universal: many parameter files, split evenly by bytes
    universal = {f"zero/p{i}/{k}.pt": 1000 + i for i in range(8) for k in ("fp32", "exp_avg", "exp_avg_sq")}
    loads = [sum(universal[f] for f in s) for s in checkpoint_shares.split_files(universal, 4)]
    assert max(loads) - min(loads) <= max(universal.values())


def test_the_wait_follows_the_largest_share():
    shares = checkpoint_shares.split_files(ZERO2, 2)
    largest = 400 + 100 + 2
    assert checkpoint_shares.share_timeout_s(ZERO2, shares) == checkpoint_shares.VERIFY_MARGIN_S + largest / 25e6
    # 100 GB over 8 ranks
    big = {f"zero_pp_rank_{r}_mp_rank_00_optim_states.pt": 12_500_000_000 for r in range(8)}
    limit = checkpoint_shares.share_timeout_s(big, checkpoint_shares.split_files(big, 8))
    assert limit == pytest.approx(120 + 500)


def test_timed_gather_on_one_rank(one_rank_group):
    assert collectives.all_gather_object_within({"a": 1}, 5, "test") == [{"a": 1}]
    assert collectives.all_gather_object_within("x", 5, "test") == ["x"]


def fake_checkpoint(tmp_path):
    tag = tmp_path / "ckpt" / "global_step1"
    tag.mkdir(parents=True)
    torch.save({"w": torch.arange(200_000, dtype=torch.float32)}, tag / "mp_rank_00_model_states.pt")
    torch.save({"m": torch.ones(50_000)}, tag / "zero_pp_rank_0_mp_rank_00_optim_states.pt")
    (tag / "growlm_state.json").write_text("{}")
    write_manifest(tag)
    return checkpoint.OpenCheckpoint(tag.parent, tag.name, SimpleNamespace(world_size=1, universal=False))


def test_verify_shares_checks_contents_and_pickles(tmp_path, one_rank_group):
    ckpt = fake_checkpoint(tmp_path)
    assert checkpoint.verify_shares(ckpt, rank=0, world_size=1) == sorted(json.loads(
        (ckpt.tag_dir / "growlm_manifest.json").read_text())["files"])  # fmt: skip
    shard = ckpt.tag_dir / "zero_pp_rank_0_mp_rank_00_optim_states.pt"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    with pytest.raises(checkpoint.CheckpointError, match="zero_pp_rank_0_mp_rank_00_optim_states.pt does not match"):
        checkpoint.verify_shares(ckpt, rank=0, world_size=1)
    # no manifest (an old checkpoint): the pickles are still checked, each by its rank
    (ckpt.tag_dir / "growlm_manifest.json").unlink()
    shard.write_bytes(pickle.dumps(print, protocol=2))  # a pickle that would call a function
    with pytest.raises(checkpoint.CheckpointError, match="cannot be read|refusing to load"):
        checkpoint.verify_shares(ckpt, rank=0, world_size=1)


def test_the_check_before_the_ranks_join_reads_sizes_only(tmp_path):
    ckpt = fake_checkpoint(tmp_path)
    files = read_manifest(ckpt.tag_dir)
    verify_files(ckpt.tag_dir, files, ["growlm_state.json"])  # one file's share
    shard = ckpt.tag_dir / "mp_rank_00_model_states.pt"
    before = psutil.Process().io_counters().read_chars
    check_sizes(ckpt.tag_dir, files)  # what open_for_resume checks of the files
    assert psutil.Process().io_counters().read_chars - before < shard.stat().st_size / 10
    with open(shard, "r+b") as f:
        f.truncate(shard.stat().st_size - 1)
    with pytest.raises(ManifestError, match="has .* bytes, the manifest says"):
        check_sizes(ckpt.tag_dir, files)
