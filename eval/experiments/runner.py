"""Running the IsoFLOP experiment's runs and keeping their curves.

Each finished run is one JSON file, OUT/curves/<phase>/<run>.json: {"settings", "spec", "curve"}, written
atomically (runtime.atomic), so an interrupted experiment resumes by skipping the files that exist. ``settings`` is
the experiment's Settings plus the token folder's checksums; a curve whose settings differ from the current ones
is refused (``SettingsMismatch``), never mixed in. Runs go to ``Workers``: ``parallel`` processes (spawned, one
thread each), or this process with ``parallel`` 1.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterable
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Any

from growlm.data.tokens import load_meta
from growlm.eval.experiments.protocol import RunSpec, Settings, settings_from_dict, spec_from_dict
from growlm.eval.experiments.runs import Run, job_key, same_data
from growlm.runtime import atomic
from growlm.runtime.processes import exit_with_parent

UNCOMPARED = ("seeds",)  # settings that add runs without changing any run


class SettingsMismatch(Exception):
    """Curves in the output folder were made with other settings than the current ones."""


class CurveFileError(Exception):
    """A curve file under OUT/curves cannot be read: not UTF-8 JSON (truncated, damaged), or not a curve record."""


def read_curve(f: Path, parse: Any = spec_from_dict) -> dict[str, Any]:
    """One curve file: {"settings": {...}, "spec": ..., "curve": {...}}, ``spec`` turned into a run by ``parse``
    (default: a RunSpec of the envelope protocols; ``runs.Run.from_dict`` for a spec-file experiment's).

    Raises:
        CurveFileError: one line naming the file, what is wrong with it and the fix (a truncated or damaged file,
            a record without one of those keys).
    """
    fix = "delete it (a rerun of growlm-experiment trains that run again) or restore it from where it came"
    try:
        rec = json.loads(f.read_bytes().decode("utf-8"))
    except UnicodeDecodeError as e:
        raise CurveFileError(f"{f} is not UTF-8 text (byte {e.start}); {fix}") from None
    except json.JSONDecodeError as e:
        where = f"{e.msg} at line {e.lineno} column {e.colno}"
        raise CurveFileError(f"{f} is not valid JSON ({where}: truncated or damaged); {fix}") from None
    except OSError as e:
        raise CurveFileError(f"{f} cannot be read ({e.strerror or e}); {fix}") from None
    problem = None
    if not isinstance(rec, dict) or not all(isinstance(rec.get(k), dict) for k in ("settings", "spec", "curve")):
        problem = "not a curve record (a JSON object with the objects settings, spec and curve)"
    else:
        try:
            rec["spec"] = parse(rec["spec"])
        except (TypeError, ValueError) as e:
            problem = f"its spec is not a run of this experiment ({e})"
    if problem:
        raise CurveFileError(f"{f}: {problem}; {fix}")
    return rec


def data_fingerprint(folder: Path) -> dict[str, Any]:
    """The token folder's identity: its vocabulary size and the checksums of its splits (from meta.json, read by
    data.tokens.load_meta: a damaged or malformed one raises its TokenFolderError, a ValueError)."""
    meta = load_meta(folder)
    return {"vocab_size": meta["vocab_size"], "train_sha256": meta["splits"]["train"].get("sha256"),
            "val_sha256": meta["splits"]["val"].get("sha256")}  # fmt: skip


def train_tokens(folder: Path) -> int:
    """The number of tokens in the token folder's train split (meta.json's count, checked against train.bin's size
    by ``data.tokens.open_tokens`` when a run opens it)."""
    return int(load_meta(folder)["splits"]["train"]["n_tokens"])


def compared(settings: dict[str, Any], with_data: bool = True) -> dict[str, Any]:
    """The part of a settings dict two curves must share (without ``data`` when ``with_data`` is False)."""
    return {k: v for k, v in settings.items() if k not in UNCOMPARED and (with_data or k != "data")}


def curve_path(out: Path, spec: RunSpec) -> Path:
    return out / "curves" / spec.phase / f"{spec.name}.json"


def load_curves(out: Path, settings: dict[str, Any], with_data: bool = True) -> dict[str, dict]:
    """Every curve under OUT/curves, by run name.

    Raises:
        SettingsMismatch: a curve's settings differ from ``settings`` (the message names the file and the keys),
            or, with ``with_data`` False, the curves come from different token folders.
        CurveFileError: a curve file is truncated, damaged or not a curve record (``read_curve``).
    """
    want = compared(settings, with_data)
    done: dict[str, dict] = {}
    datas = set()
    for f in sorted((out / "curves").glob("*/*.json")):
        rec = read_curve(f)
        got = compared(rec["settings"], with_data)
        if got != want:
            keys = sorted(k for k in set(got) | set(want) if got.get(k) != want.get(k))
            raise SettingsMismatch(
                f"{f} was made with other settings ({', '.join(keys)} differ); use another --out, or the "
                "settings it was made with"
            )
        datas.add(json.dumps(rec["settings"].get("data"), sort_keys=True))
        done[rec["spec"].name] = rec
    if len(datas) > 1:
        raise SettingsMismatch(f"the curves under {out / 'curves'} come from {len(datas)} different token folders")
    return done


def _init_worker(parent: int | None = None) -> None:
    if parent is not None:  # a worker process ends with the command: none trains on, or writes a curve, once it is gone
        exit_with_parent(parent)
    import torch  # lazy: only in the processes that train

    torch.set_num_threads(1)


def _work(s: Settings, spec: RunSpec, data: Path, path: Path, settings: dict[str, Any]) -> tuple[str, float]:
    from growlm.eval.experiments.train_run import train_run  # lazy: torch, only in the processes that train

    curve = train_run(s, spec, data)
    rec = {"settings": settings, "spec": spec.as_dict(), "curve": curve}
    if isinstance(spec, Run):  # a spec's run records its identity, so that any later experiment can import it
        rec["job"] = job_key(spec.job(s))
    atomic.write_json(path, rec, indent=None)
    return spec.name, curve["wall_s"]


class Workers:
    """``parallel`` worker processes (spawned, one thread each) kept for the whole experiment, so each imports torch
    once; with ``parallel`` 1 the runs train in this process. Use as a context manager. A worker ends when this
    process is gone (``runtime.processes.exit_with_parent``): a growlm-experiment killed mid-run leaves no run
    training on, and the runs it had started are started again by the next invocation."""

    def __init__(self, parallel: int) -> None:
        self.parallel = parallel
        self.pool: ProcessPoolExecutor | None = None

    def __enter__(self) -> Workers:
        if self.parallel > 1:
            import multiprocessing as mp  # lazy: only with worker processes

            os.environ.setdefault("OMP_NUM_THREADS", "1")
            self.pool = ProcessPoolExecutor(
                self.parallel, mp_context=mp.get_context("spawn"), initializer=_init_worker, initargs=(os.getpid(),)
            )
        else:
            _init_worker()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=True, cancel_futures=True)


def run_all(s: Settings, specs: Iterable[RunSpec], data: Path, out: Path, settings: dict[str, Any],
            workers: Workers, label: str) -> list[str]:  # fmt: skip
    """Train every spec whose curve file does not exist yet; returns the names of the runs that failed (each
    failure printed with its cause; the other runs finish). Progress: a tqdm bar on stderr."""
    from tqdm import tqdm  # lazy: only when runs start

    todo = [sp for sp in dict.fromkeys(specs) if not curve_path(out, sp).is_file()]
    if not todo:
        return []
    # seed by seed, so that a phase stopped part way leaves whole seeds to report; within a seed the long runs
    # first, so that the workers finish together
    todo.sort(key=lambda sp: (sp.seed, -sp.budget))
    for sp in todo:
        curve_path(out, sp).parent.mkdir(parents=True, exist_ok=True)
    failed: list[str] = []
    bar = tqdm(total=len(todo), desc=label, unit="run", file=sys.stderr, dynamic_ncols=True)

    def report(sp: RunSpec, e: Exception) -> None:
        failed.append(sp.name)
        tqdm.write(f"growlm-experiment: run {sp.name} failed: {type(e).__name__}: {e}", file=sys.stderr)

    if workers.pool is None:
        for sp in todo:
            try:
                _work(s, sp, data, curve_path(out, sp), settings)
            except Exception as e:  # noqa: BLE001 - reported per run; the others go on
                report(sp, e)
            bar.update()
    else:
        futures = {workers.pool.submit(_work, s, sp, data, curve_path(out, sp), settings): sp for sp in todo}
        for fut in as_completed(futures):
            try:
                fut.result()
            except Exception as e:  # noqa: BLE001 - reported per run; the others go on
                report(futures[fut], e)
            bar.update()
    bar.close()
    return failed


class Store:
    """The finished runs an experiment can read, by ``job_key``: its own curves (OUT/curves/<phase>/<run>.json, a
    spec's runs, or an earlier protocol's written into the same folder) and those of the ``imports`` folders (curve
    files of any growlm experiment: an earlier protocol's turned into its Job by that protocol's code, a spec's by
    the Job it recorded), when they were trained on this experiment's token folder (``data``; None: the one its own
    curves record).

    Raises (constructor):
        CurveFileError: a curve file is damaged, not a curve record, or holds no final validation loss.
        SettingsMismatch: one of this experiment's own curves was made by another experiment, from another token
            folder, or by other settings than the spec's now (another shape rule, training setting or arm).
    """

    def __init__(self, ctx: Any, out: Path, imports: list[Path], data: dict[str, Any] | None) -> None:
        self.ctx, self.data = ctx, data
        self.by_key: dict[str, dict] = {}
        self.own: dict[str, dict] = {}
        self.imported = 0
        self.read: dict[str, dict] = {}  # job key -> record: every finished run a lookup found
        self.own_earlier: list[dict] = []  # the curves an earlier protocol wrote into this folder
        files = [(f, True) for f in sorted((out / "curves").glob("*/*.json"))]
        files += [(f, False) for folder in imports for f in sorted(folder.glob("*/*.json"))]
        recs = [(f, here, _record(f)) for f, here in files]
        if self.data is None:  # --report_only: the token folder the experiment's own curves record
            seen = [r["settings"].get("data") for _, here, r in sorted(recs, key=lambda x: not x[1])]
            self.data = seen[0] if seen else None
        for f, here, rec in recs:
            if not same_data(rec["settings"].get("data"), self.data):
                if here:
                    raise SettingsMismatch(f"{f} comes from another token folder than the experiment's; move it "
                                           "away (a rerun trains it again) or give its --data")  # fmt: skip
                continue
            if "stages" not in rec["spec"]:  # an earlier protocol's run: its RunSpec under its Settings
                rec["spec"] = spec_from_dict(rec["spec"])
                self.by_key.setdefault(job_key(rec["spec"].job(settings_from_dict(rec["settings"]))), rec)
                self.imported += 1
                if here:
                    self.own_earlier.append(rec)
                continue
            key = self._spec_key(f, rec, here)
            if key is None:
                continue
            if here:
                self.own[rec["spec"].name] = rec
                self.by_key[key] = rec
            else:
                self.by_key.setdefault(key, rec)
                self.imported += 1

    def _spec_key(self, f: Path, rec: dict, here: bool) -> str | None:
        """The identity of a spec experiment's curve: the Job it recorded; for one of this experiment's own curves,
        checked against the spec as it is now (a curve without a recorded Job: its recorded model and train settings
        against the spec's). None for an imported curve that recorded no Job (it cannot be resolved)."""
        try:
            rec["spec"] = Run.from_dict(rec["spec"])
        except (TypeError, ValueError) as e:
            raise CurveFileError(f"{f}: its spec is not a run of a spec file ({e}); delete it (a rerun trains it "
                                 "again) or restore it from where it came") from None  # fmt: skip
        if not here:
            return rec.get("job")
        spec = self.ctx.spec
        if rec["settings"].get("experiment") != spec.name:
            who = rec["settings"].get("experiment")
            raise SettingsMismatch(f"{f} was made by another experiment ({who!r}); use another --out")
        try:
            key = job_key(rec["spec"].job(self.ctx))
        except KeyError as e:
            raise SettingsMismatch(f"{f} is a run of arm {e} that the spec no longer has; restore the arm, or move "
                                   "the curve away") from None  # fmt: skip
        mine = {"model": spec.model.model_dump(mode="json"), "train": spec.train.model_dump(mode="json")}
        recorded = rec.get("job") or {k: rec["settings"].get(k) for k in mine}
        if recorded != (key if "job" in rec else mine):
            raise SettingsMismatch(f"{f} was trained with other settings than the spec's now (model, train or the "
                                   "arm's operator); restore the spec, or use another --out")  # fmt: skip
        return key

    def get(self, run: Run, mark: bool = True) -> dict | None:
        """The finished record of ``run`` (its own or an imported run with the same Job), None when not run; with
        ``mark``, a record found counts as read by the report (``read``)."""
        key = job_key(run.job(self.ctx))
        rec = self.by_key.get(key)
        if rec is not None and mark:
            self.read[key] = rec
        return rec

    def loss(self, run: Run, mark: bool = True) -> float | None:
        """The final validation loss of ``run``, None when it has not finished (``mark``: as ``get``)."""
        rec = self.get(run, mark)
        return None if rec is None else float(rec["curve"]["final"]["val_loss"])

    def has(self, run: Run) -> bool:
        return self.get(run) is not None


def _record(f: Path) -> dict:
    """A curve file's record, its spec left as read (``read_curve``), with a final validation loss.

    Raises:
        CurveFileError: as ``read_curve``, or no final validation loss.
    """
    rec = read_curve(f, lambda d: d)
    if not isinstance(rec["curve"].get("final", {}).get("val_loss"), int | float):
        raise CurveFileError(f"{f}: its curve has no final validation loss (curve.final.val_loss); delete it (a rerun "
                             "trains that run again) or restore it from where it came")  # fmt: skip
    return rec
