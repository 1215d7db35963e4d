"""Which rank hashes (on save) and checks (on resume) which file of a checkpoint's tag folder, and how long a rank
waits for the others to do theirs: the files named for a rank go to it, the shared ones are split by size.
"""

from __future__ import annotations

import re
from pathlib import Path

from growlm.runtime.atomic import TMP_PREFIX
from growlm.runtime.manifest import MANIFEST_FILE

VERIFY_MARGIN_S = 120.0  # seconds a rank's wait for the others gets beyond the slowest share's reading
MIN_READ_BYTES_PER_S = 25e6  # the slowest reading a share's wait allows for: a loaded network filesystem
_RANK_FILE = re.compile(r"^(?:zero_pp_rank_(\d+)_.*|rng_state_rank(\d+)\.pt)$")


def file_rank(rel: str) -> int | None:
    """The rank a tag folder's file belongs to by its name (DeepSpeed's ``zero_pp_rank_R_...`` optimizer and ZeRO-3
    model-state shards, growlm's ``rng_state_rankR.pt``: data-parallel rank R, which is the global rank in growlm),
    or None for a file every rank may read (``mp_rank_00_model_states.pt``, ``growlm_state.json``, the universal
    layout's ``zero/`` files)."""
    found = _RANK_FILE.match(rel)
    if found is None:
        return None
    return int(found.group(1) if found.group(1) is not None else found.group(2))


def split_files(sizes: dict[str, int], world_size: int, *, by_name: bool = True) -> list[list[str]]:
    """Each rank's share of a tag folder's files, for hashing on save and checking on resume.

    Args:
        sizes: relative path -> bytes, every file to share out.
        world_size: the ranks sharing the work.
        by_name: a file named for a rank below ``world_size`` (``file_rank``) goes to that rank: the rank that
            wrote it, and on a resume at the saved world size the only rank that loads it. Off (a resume at another
            world size, a universal checkpoint): every file is shared.

    Returns:
        ``world_size`` sorted lists of relative paths, together holding each file once. The shared files go, largest
        first, to the rank with the fewest bytes so far (ties: the lowest rank), so no rank's share exceeds the
        even split by more than the largest file; the result depends only on the arguments, so every rank computes
        the same split.
    """
    shares: list[list[str]] = [[] for _ in range(world_size)]
    load = [0] * world_size
    shared = []
    for rel, size in sizes.items():
        r = file_rank(rel) if by_name else None
        if r is not None and r < world_size:
            shares[r].append(rel)
            load[r] += size
        else:
            shared.append(rel)
    for rel in sorted(shared, key=lambda f: (-sizes[f], f)):
        r = min(range(world_size), key=lambda i: (load[i], i))
        shares[r].append(rel)
        load[r] += sizes[rel]
    return [sorted(s) for s in shares]


def share_timeout_s(sizes: dict[str, int], shares: list[list[str]]) -> float:
    """How long a rank waits for the others to hash or check their shares: ``VERIFY_MARGIN_S`` plus the largest
    share's bytes read at ``MIN_READ_BYTES_PER_S``, so the limit follows the checkpoint's size (a 100 GB checkpoint
    over 8 ranks: about 120 + 500 s; over 64: 120 + 63 s) instead of the process group's fixed timeout."""
    largest = max((sum(sizes[f] for f in share) for share in shares), default=0)
    return VERIFY_MARGIN_S + largest / MIN_READ_BYTES_PER_S


def tag_files(tag_dir: Path) -> dict[str, int]:
    """Relative path -> bytes of every file under a tag folder except its manifest and ``.tmp-`` names."""
    return {
        p.relative_to(tag_dir).as_posix(): p.stat().st_size
        for p in sorted(tag_dir.rglob("*"))
        if p.is_file() and p.name != MANIFEST_FILE and not p.name.startswith(TMP_PREFIX)
    }
