"""growth.offline.shards and the one-pass writers of growth.offline.universal, on small synthetic ZeRO shard files (no
process
started): the merge of each rank's pieces into full tensors (ZeRO-1/2 fragment addresses, ZeRO-3 padded
partitions), the refusal of shards of another model, and files hashed while written for the manifest. The real
checkpoints, compared with DeepSpeed's ds_to_universal tensor by tensor, are in
tests/distributed/test_grow_checkpoint.py."""

from __future__ import annotations

import gc
import math
from collections import OrderedDict
from pathlib import Path

import pytest
import torch

from growlm.growth.offline.shards import ZeroShardStore, drop_pages
from growlm.growth.offline.universal import UniversalStore, Written
from growlm.runtime.checkpoint import CheckpointError, safe_load
from growlm.runtime.manifest import file_sha256, verify_manifest, write_manifest

SHAPES = {"a.weight": (3, 5), "b.bias": (7,), "c.weight": (2, 4)}  # 15 + 7 + 8 = 30 elements
KEYS = ("fp32", "exp_avg", "exp_avg_sq")


def full(name: str, key: str) -> torch.Tensor:
    """A distinct tensor per (parameter, key)."""
    n = math.prod(SHAPES[name])
    return torch.arange(n, dtype=torch.float32).reshape(SHAPES[name]) + 100 * list(SHAPES).index(name) + KEYS.index(key)


def save_zero12(tag, world: int) -> None:
    """One parameter group holding every parameter, flattened and split into ``world`` contiguous partitions."""
    from deepspeed.utils.tensor_fragment import fragment_address

    flats = {k: torch.cat([full(n, k).flatten() for n in SHAPES]) for k in KEYS}
    per = math.ceil(flats["fp32"].numel() / world)
    offsets, at = {}, 0
    for n, s in SHAPES.items():
        offsets[n] = (at, at + math.prod(s))
        at += math.prod(s)
    for r in range(world):
        lo, hi = r * per, min((r + 1) * per, at)
        mapping = OrderedDict()
        for n, (a, b) in offsets.items():
            s, e = max(a, lo), min(b, hi)
            if s < e:
                mapping[n] = fragment_address(numel=e - s, start=s - lo)
        part = {k: v[lo:hi].clone() for k, v in flats.items()}
        osd = {
            "base_optimizer_state": {
                "state": {0: {"step": torch.tensor(7.0), "exp_avg": part["exp_avg"], "exp_avg_sq": part["exp_avg_sq"]}},
                "param_groups": [{"lr": 0.1, "params": [0]}],
            },
            "single_partition_of_fp32_groups": [part["fp32"]],
            "param_slice_mappings": [mapping],
            "clip_grad": 1.0,
        }
        torch.save({"optimizer_state_dict": osd}, tag / f"zero_pp_rank_{r}_mp_rank_00_optim_states.pt")


def save_zero3(tag, world: int) -> None:
    """Two sub-groups; every parameter padded to ceil(numel / world) elements per rank."""
    split = (("a.weight", "c.weight"), ("b.bias",))
    groups = [OrderedDict((n, torch.Size(SHAPES[n])) for n in names) for names in split]
    for r in range(world):
        flat = {k: [] for k in KEYS}
        for g in groups:
            for k in KEYS:
                pieces = []
                for n in g:
                    x = full(n, k).flatten()
                    per = math.ceil(x.numel() / world)
                    piece = x[r * per : (r + 1) * per]
                    pieces.append(torch.cat([piece, torch.full((per - piece.numel(),), -1.0)]))  # padding
                flat[k].append(torch.cat(pieces))
        state = {i: {"step": torch.tensor(7.0), "exp_avg": flat["exp_avg"][i], "exp_avg_sq": flat["exp_avg_sq"][i]}
                 for i in range(2)}  # fmt: skip
        osd = {"optimizer_state_dict": {"state": state, "param_groups": [{"lr": 0.1}] * 2}, "fp32_flat_groups":
               flat["fp32"]}  # fmt: skip
        torch.save({"optimizer_state_dict": osd}, tag / f"zero_pp_rank_{r}_mp_rank_00_optim_states.pt")
        torch.save({"param_shapes": groups}, tag / f"zero_pp_rank_{r}_mp_rank_00_model_states.pt")


@pytest.mark.parametrize("aliased", [False, True])
@pytest.mark.parametrize("stage, world", [(2, 2), (1, 3), (3, 2), (3, 3), (2, 1)])
def test_pieces_of_every_rank_merge_into_the_full_tensors(tmp_path, stage, world, aliased):
    (save_zero3 if stage == 3 else save_zero12)(tmp_path, world)
    store = ZeroShardStore(tmp_path, SHAPES, zero_stage=stage, world=world, aliased=aliased)
    for name in SHAPES:
        got = store.read(name)
        for key, t in zip(KEYS, got, strict=True):
            assert t.dtype == torch.float32 and torch.equal(t, full(name, key)), (name, key)
    assert float(store.adam_step()) == 7.0
    opt = store.optimizer_state()
    assert opt["param_groups"][0]["lr"] == 0.1 and "fp32_flat_groups" not in opt
    assert "single_partition_of_fp32_groups" not in opt and "param_slice_mappings" not in opt
    if stage == 3:
        assert float(opt["optimizer_state_dict"]["state"][1]["step"]) == 7.0


def test_shards_of_another_model_or_a_missing_rank_are_refused(tmp_path):
    save_zero12(tmp_path, 2)
    with pytest.raises(CheckpointError, match=r"hold 15 elements of a.weight, but its shape .* is \(3, 6\)"):
        ZeroShardStore(tmp_path, {**SHAPES, "a.weight": (3, 6)}, zero_stage=2, world=2)
    with pytest.raises(CheckpointError, match=r"not in the checkpoint's model config and lack \['d.weight'\]"):
        ZeroShardStore(tmp_path, {**SHAPES, "d.weight": (2,)}, zero_stage=2, world=2)
    with pytest.raises(CheckpointError, match="holds 0 files zero_pp_rank_2_mp_rank_00_optim_states.pt"):
        ZeroShardStore(tmp_path, SHAPES, zero_stage=2, world=3)


def test_files_hashed_while_written_make_a_valid_manifest(tmp_path):
    tag = tmp_path / "global_step1"
    written = Written(tag)
    store = UniversalStore(tag / "zero", SHAPES, flat=False, step=torch.tensor(3.0), written=written)
    for name in SHAPES:
        store.write(name, tuple(full(name, k) for k in KEYS))
    written.close()
    assert len(written.hashes) == 4 * len(SHAPES)  # fp32, exp_avg, exp_avg_sq, step.pt
    for rel, (nbytes, digest) in written.hashes.items():
        assert (tag / rel).stat().st_size == nbytes and file_sha256(tag / rel) == digest
    (tag / "extra.txt").write_text("not hashed while written")
    write_manifest(tag, known=written.hashes)
    assert verify_manifest(tag)
    assert torch.equal(store.read_tensor("a.weight", "exp_avg"), full("a.weight", "exp_avg"))


def test_drop_pages_keeps_a_mapped_tensor_readable(tmp_path):
    x = torch.randn(300_000)
    torch.save(x, tmp_path / "x.pt")
    y = safe_load(tmp_path / "x.pt", mmap=True)
    assert torch.equal(y[1000:200_000].clone(), x[1000:200_000])
    drop_pages(y[1000:200_000])  # pages of a read-only mapping are re-read from the file when touched again
    assert torch.equal(y, x)


def test_an_aliased_read_is_the_files_bytes_and_saves_as_a_copy_would(tmp_path):
    save_zero12(tmp_path, 3)  # 10 elements per rank: a.weight (0-14) and b.bias (15-21) span two, c.weight one
    aliased = ZeroShardStore(tmp_path, SHAPES, zero_stage=1, world=3, aliased=True)
    copied = ZeroShardStore(tmp_path, SHAPES, zero_stage=1, world=3)
    assert [len(aliased.pieces[n]) for n in SHAPES] == [2, 2, 1]
    one, other = aliased.read_tensor("c.weight", "exp_avg"), copied.read_tensor("c.weight", "exp_avg")
    flat = aliased._flat[2]["exp_avg"][0]  # rank 2 holds elements 20-29: c.weight from its third element
    assert one.data_ptr() == flat.data_ptr() + 2 * 4 and torch.equal(one, other)  # the mapped file's own bytes
    assert one.untyped_storage().nbytes() == 8 * 4  # a storage of its own, so torch.save writes just these bytes
    spanning = aliased.read_tensor("a.weight", "fp32")  # two pieces: copied
    assert spanning.untyped_storage().data_ptr() != flat.data_ptr() and torch.equal(spanning, full("a.weight", "fp32"))
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    torch.save({"param": one}, tmp_path / "a" / "p.pt")
    torch.save({"param": other.detach()}, tmp_path / "b" / "p.pt")
    assert (tmp_path / "a" / "p.pt").read_bytes() == (tmp_path / "b" / "p.pt").read_bytes()
    aliased.close()
    assert torch.equal(one, full("c.weight", "exp_avg"))  # the alias keeps the mapping after the store closes


def mapped(path: Path) -> bool:
    """Whether this process holds a memory map of ``path`` (Linux: /proc/self/maps names each mapped file)."""
    return str(path) in Path("/proc/self/maps").read_text()


@pytest.mark.skipif(not Path("/proc/self/maps").is_file(), reason="reads the process's memory maps from Linux's /proc")
def test_a_detached_aliased_read_keeps_the_file_mapped_after_the_store_closes(tmp_path):
    save_zero12(tmp_path, 3)
    rank2 = tmp_path / "zero_pp_rank_2_mp_rank_00_optim_states.pt"  # holds c.weight whole
    store = ZeroShardStore(tmp_path, SHAPES, zero_stage=1, world=3, aliased=True)
    # detached, as the universal writer queues it: no _base, so nothing refers to the alias tensor itself any more
    param = store.read_tensor("c.weight", "exp_avg").detach()
    assert mapped(rank2) and param._base is None
    store.close()  # a reshard closes the store while the writer threads may still be saving what it read
    gc.collect()
    assert mapped(rank2)  # the mapping lives with the storage (before: unmapped here, and a writer reading it crashed)
    assert torch.equal(param, full("c.weight", "exp_avg"))
    (tmp_path / "out").mkdir()
    written = Written(tmp_path / "out")
    written.save({"param": param}, tmp_path / "out" / "p.pt")
    written.close()
    assert torch.equal(safe_load(tmp_path / "out" / "p.pt")["param"], full("c.weight", "exp_avg"))
    del param, written
    gc.collect()
    assert not mapped(rank2)  # and goes with the last tensor that reads it
