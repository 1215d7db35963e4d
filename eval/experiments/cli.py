"""growlm-experiment: does growing beat the model you could have trained instead? The IsoFLOP-envelope experiment
(eval/experiments/protocol.py; DESIGN.md, "Does growth pay"): a pilot tunes every size's and arm's LR, then the
main runs measure the envelope and the growth arms over several seeds; the report compares each arm with the best
scratch model at the same FLOPs.

    growlm-experiment                       # pilot + main on this CPU, results in eval/results/isoflop/
    growlm-experiment --phase pilot         # the pilot only
    growlm-experiment --phase map           # the crossover map (budgets 1..64 C), results in
                                            # eval/results/isoflop_map/ (eval/experiments/crossmap.py)
    growlm-experiment --phase optimal       # the experiment at the map's budget B, where the growth target is
                                            # the best scratch size (eval/experiments/optimal.py), results in
                                            # eval/results/isoflop_optimal/
    growlm-experiment --report_only         # rebuild report.md, results.json and the plots from the curves
    growlm-experiment --quick --out runs/isoflop_quick      # the whole pipeline at toy size, under a minute
    growlm-experiment --profile gpu         # the GPU profile (16 seeds, larger budgets), results in
                                            # eval/results/isoflop_gpu/
    growlm-experiment --spec eval/results/isoflop_optimum/experiment.yaml
                                            # an experiment written as a spec file (eval/experiments/spec.py;
                                            # docs/evaluation.md): its curves and report beside the file

Exit status: 0 done; 1 a run failed (the others finish; a rerun retries it); 2 bad flags, curves in --out made
with other settings or damaged, or another growlm-experiment writing --out (refused before anything is touched).
"""

from __future__ import annotations

import argparse
import json
import sys
from contextlib import ExitStack
from dataclasses import replace
from pathlib import Path
from typing import Any

from growlm.runtime.atomic import write_json as atomic_write_json
from growlm.runtime.commands import HelpFormatter, add_version, interruptible
from growlm.runtime.lock import LockHeldError, output_held_message, output_lock

DEFAULT_OUT = {"cpu": "eval/results/isoflop", "gpu": "eval/results/isoflop_gpu"}
DEFAULT_MAP_OUT = {"cpu": "eval/results/isoflop_map", "gpu": "eval/results/isoflop_map_gpu"}
DEFAULT_OPTIMAL_OUT = {"cpu": "eval/results/isoflop_optimal", "gpu": "eval/results/isoflop_optimal_gpu"}


def build_parser() -> argparse.ArgumentParser:
    """growlm-experiment's flags."""
    p = argparse.ArgumentParser(prog="growlm-experiment", description=__doc__.split("\n\n")[0],
                                formatter_class=HelpFormatter)  # fmt: skip
    p.add_argument("--spec", type=Path, default=None,
                   help="an experiment's spec file (YAML; eval/experiments/spec.py): run it, or with --report_only "
                        "rebuild its report; its folder is the default --out")  # fmt: skip
    p.add_argument("--out", type=Path, default=None,
                   help="folder of the curves (curves/) and the report (default: eval/results/isoflop, "
                        "eval/results/isoflop_gpu with --profile gpu; runs/isoflop_quick with --quick)")  # fmt: skip
    p.add_argument("--profile", choices=("cpu", "gpu"), default="cpu", help="settings profile (default: %(default)s)")
    p.add_argument("--quick", action="store_true", help="the same protocol at toy size (2 seeds): the pipeline test")
    p.add_argument("--phase", choices=("all", "pilot", "map", "optimal"), default="all",
                   help="'pilot': stop after the pilot; 'map': the crossover map instead (every size at 1..64 C, "
                        "its own --out); 'optimal': the experiment at the map's budget B and target (pilot, main, "
                        "levers, then the refine runs in a sub-folder; its own --out) (default: "
                        "%(default)s)")  # fmt: skip
    p.add_argument("--map", type=Path, default=None,
                   help="--phase optimal: the crossover map's folder, with its map.json (default: the map's --out "
                        "default, eval/results/isoflop_map)")  # fmt: skip
    p.add_argument(
        "--target", default=None, help="--phase optimal: the growth target instead of the map's choice (with --budget)"
    )
    p.add_argument(
        "--budget",
        type=float,
        default=None,
        help="--phase optimal: the budget B (x C, one the map measured) instead of the map's choice",
    )
    p.add_argument("--seeds", type=int, default=None, help="main-run seeds (default: the profile's, 5 on cpu)")
    p.add_argument("--parallel", type=int, default=None,
                   help="runs at once, one thread each (default: 2 on cpu, 8 on gpu)")  # fmt: skip
    p.add_argument("--device", default=None, help="torch device of the runs (default: the profile's, cpu or cuda)")
    p.add_argument(
        "--data",
        type=Path,
        default=None,
        help="token folder of the 320-token BPE (default: GROWLM_CACHE/bpe320, prepared when missing)",
    )
    p.add_argument("--report_only", action="store_true", help="run nothing: rebuild the report from --out's curves")
    p.add_argument("--dry_run", action="store_true", help="print the runs that would start now, run nothing")
    return add_version(p)


def fail(msg: str) -> int:
    print(f"growlm-experiment: error: {msg}", file=sys.stderr)
    return 2


@interruptible("growlm-experiment")
def main(argv: list[str] | None = None) -> int:
    """growlm-experiment (see the module docstring)."""
    args = build_parser().parse_args(argv)
    if args.spec is not None:
        return _spec_cli(args)
    from growlm.eval.experiments import protocol  # lazy: --help and --version stay fast

    s = protocol.PROFILES[args.profile]
    if args.quick:
        s = protocol.quick(s)
    if args.seeds is not None:
        if args.seeds < 2:
            return fail(f"--seeds {args.seeds}: a 95% interval needs at least 2 seeds")
        if args.seeds > s.pilot_seed:
            return fail(f"--seeds {args.seeds}: the main seeds 0..{args.seeds - 1} would include the pilot's seed "
                        f"{s.pilot_seed}; at most {s.pilot_seed}")  # fmt: skip
        s = replace(s, seeds=args.seeds, budgets_2c_seeds=min(s.budgets_2c_seeds, args.seeds))
    if args.device:
        s = replace(s, device=args.device)
    parallel = args.parallel if args.parallel is not None else (8 if args.profile == "gpu" else 2)
    if parallel < 1:
        return fail(f"--parallel {parallel}: must be >= 1")
    if (args.map or args.target or args.budget is not None) and args.phase != "optimal":
        return fail("--map, --target and --budget belong to --phase optimal; add it, or drop them")
    if (args.target is None) != (args.budget is None):
        return fail("--target and --budget go together (the target is the best size at one budget); give both")
    if args.phase == "map":
        out = args.out or Path("runs/isoflop_map_quick" if args.quick else DEFAULT_MAP_OUT[args.profile])
    elif args.phase == "optimal":
        out = args.out or Path("runs/isoflop_optimal_quick" if args.quick else DEFAULT_OPTIMAL_OUT[args.profile])
    else:
        out = args.out or Path("runs/isoflop_quick" if args.quick else DEFAULT_OUT[args.profile])
    if out.exists() and not out.is_dir():
        return fail(f"--out {out} is a file; give a folder")
    if args.dry_run and not args.report_only:  # writes nothing under --out
        return _checked(args, s, out, parallel)
    return _held(out, lambda: _checked(args, s, out, parallel))


def _held(out: Path, work) -> int:
    """``work()`` with --out held by this process: one growlm-experiment per --out (two would train the same runs
    and race on its files); 2 with a one-line reason when another holds it or it cannot be used."""
    lock = ExitStack()
    try:
        lock.enter_context(output_lock(out))
    except LockHeldError as e:
        return fail(output_held_message("--out", out, e))
    except OSError as e:
        return fail(f"--out {out} cannot be used ({e.strerror or e}); choose a folder you can write")
    with lock:
        return work()


SPEC_ONLY_NOT = ("phase", "map", "target", "budget", "seeds", "quick")


def _spec_cli(args) -> int:
    """growlm-experiment --spec FILE: check the flags and the file, hold --out, then run or report."""
    from growlm.eval.experiments import spec as sp  # lazy: as in main

    bad = [f"--{k}" for k in SPEC_ONLY_NOT if getattr(args, k) is not None and getattr(args, k) is not False
           and getattr(args, k) != "all"]  # fmt: skip
    if bad or args.profile != "cpu":
        return fail(f"{', '.join(bad) or '--profile'}: the spec file says what runs; drop the flag with --spec")
    try:
        spec = sp.load(args.spec)
    except sp.SpecError as e:
        return fail(str(e))
    if args.device:
        spec = spec.model_copy(update={"train": spec.train.model_copy(update={"device": args.device})})
    parallel = args.parallel if args.parallel is not None else 2
    if parallel < 1:
        return fail(f"--parallel {parallel}: must be >= 1")
    out = args.out or args.spec.parent
    imports = [(args.spec.parent / x).resolve() for x in spec.imports]
    if missing := [str(x) for x in imports if not x.is_dir()]:
        return fail(f"{args.spec}: imports {missing[0]} is not a folder of curves; fix the path (relative to the "
                    "spec file's folder)")  # fmt: skip
    if out.exists() and not out.is_dir():
        return fail(f"--out {out} is a file; give a folder")
    if args.dry_run and not args.report_only:  # writes nothing: beside a running experiment too
        return _spec_checked(args, spec, out, imports, parallel)
    return _held(out, lambda: _spec_checked(args, spec, out, imports, parallel))


def _spec_checked(args, spec, out: Path, imports: list[Path], parallel: int) -> int:
    """``_spec_run``, with damaged or foreign curves, a pre-registration the spec or curves disagree with, and a
    design the shapes cannot give reported as bad input (2)."""
    from growlm.eval.experiments import render, runner  # lazy: as in main

    try:
        return _spec_run(args, spec, out, imports, parallel)
    except (runner.SettingsMismatch, runner.CurveFileError, render.PreregError, ValueError) as e:
        return fail(str(e))


def _spec_run(args, spec, out: Path, imports: list[Path], parallel: int) -> int:
    """The runs of a spec's plan, round after round, the pre-registration's decisions fixed before the runs that
    depend on them, then results.json and report.md (only the report with --report_only)."""
    from growlm.eval.experiments import planner, render, runner  # lazy: as in main

    ctx = planner.Context(spec)
    where = out / render.PREREG
    pre = render.read_json(where) if where.is_file() else None
    if pre is not None:
        render.prereg_check(pre, args.spec, args.report_only)
    fp, data = None, None
    if not args.report_only:
        from growlm.data.tokens import cache_dir  # lazy: only for the data check

        default = cache_dir() / "".join([f"bpe{spec.model.vocab_size}", *(f"-{e}" for e in spec.data.extra)])
        got = _token_folder(args.data, default, spec.model.vocab_size, spec.data.extra, spec.train.seq_len,
                            lambda: planner.max_train_windows(ctx), "the spec's longest scratch run")  # fmt: skip
        if isinstance(got, int):
            return got
        data, fp, _ = got
    store = runner.Store(ctx, out, imports, fp)
    if args.report_only:
        planner.plan(ctx, store.loss)
        if not store.read:
            return fail(f"no finished run of this spec under {out / 'curves'} or its imports; run growlm-experiment "
                        f"--spec {args.spec} first")  # fmt: skip
    settings = {"experiment": spec.name, "protocol": spec.protocol, "model": spec.model.model_dump(mode="json"),
                "train": spec.train.model_dump(mode="json"), "data": fp}  # fmt: skip
    with ExitStack() as stack:
        workers = None if args.report_only or args.dry_run else stack.enter_context(runner.Workers(parallel))
        rnd = 0
        while True:
            need, st = planner.plan(ctx, store.loss)
            if args.report_only:
                break
            todo = [r for r in dict.fromkeys(need) if not store.has(r)]
            if args.dry_run:
                from growlm.eval.experiments.crossmap import eta_line  # lazy: as in main

                for r in todo:
                    print(f"{r.phase:7s} {r.name:64s} steps {r.job(ctx).steps[-1]:6d}")
                print(eta_line(ctx, store.own, todo, parallel, "B"))
                return 0
            if pre is None:
                if store.own:
                    n = len(store.own)
                    raise render.PreregError(
                        f"{where} is missing while {n} of this experiment's runs have "
                        "finished; restore it (it fixed the comparison before them)"
                    )
                out.mkdir(parents=True, exist_ok=True)
                pre = render.prereg_new(spec, args.spec)
                atomic_write_json(where, pre)
            if st.optimum is not None and spec.arms:
                pre = render.prereg_fix(where, pre, "optimum", st.optimum, "any arm run")
            if st.primary is not None:
                chosen = st.arms[st.primary].chosen.as_dict()
                pre = render.prereg_fix(where, pre, "primary_arm", {"arm": st.primary, "run": chosen},
                                        "its main runs")  # fmt: skip
            if not todo:
                break
            rnd += 1
            from growlm.eval.experiments.crossmap import eta_line  # lazy: as in main

            print(f"growlm-experiment: {spec.name} round {rnd}: {eta_line(ctx, store.own, todo, parallel, 'B')}",
                  flush=True)  # fmt: skip
            failed = runner.run_all(ctx, todo, data, out, settings, workers, f"{spec.name} round {rnd}")
            store = runner.Store(ctx, out, imports, fp)
            if failed:
                return 1
            if lost := [r.name for r in todo if not store.has(r)]:  # a file of its name holds another run
                return fail(
                    f"{out / 'curves'}: the curve {lost[0]} holds another run than the one planned under "
                    "its name (an LR or growth point that differs past the name's digits); move it away"
                )
            _spec_write(ctx, store, planner.plan(ctx, store.loss)[1], pre, out, args.spec.name)  # the report so far
    res = _spec_write(ctx, store, st, pre, out, args.spec.name)
    p = res["primary"] or {}
    print(f"growlm-experiment: {spec.name}: report in {out / 'report.md'}; optimum {res['optimum']}, primary arm "
          f"{res['primary_arm']}, saving vs envelope {(p.get('saving_vs_envelope') or {}).get('mean')}")  # fmt: skip
    return 0


def _token_folder(
    given: Path | None, default: Path, vocab: int, extra: tuple, seq_len: int, need: Any, longest: str
) -> tuple[Path, dict, int] | int:
    """The experiment's token folder (``given`` by --data, else ``default`` in growlm's cache, prepared when missing),
    its fingerprint and its training windows of ``seq_len`` tokens; or 2 after a one-line error: a --data without
    meta.json, another vocabulary than ``vocab``, or fewer than half the windows ``need(have)`` says its longest run
    (``longest``, in words) reads."""
    from growlm.eval.experiments import runner  # lazy: as in main

    data = given or default
    if not (data / "meta.json").is_file():
        if given is not None:
            return fail(f"--data {data} has no meta.json; prepare it with python -m growlm.data.small_vocab")
        from growlm.data.small_vocab import ensure_small_vocab  # lazy: HF tokenizers, only when preparing

        print(f"growlm-experiment: training a {vocab}-token BPE into {data}", flush=True)
        try:
            ensure_small_vocab(data, vocab, extra=extra)  # a second growlm-experiment waits for the first to prepare it
        except (FileExistsError, FileNotFoundError, ValueError) as e:
            return fail(f"preparing the {vocab}-token BPE into {data}: {e}")
    try:
        fp = runner.data_fingerprint(data)
    except ValueError as e:  # data.tokens.TokenFolderError: a malformed meta.json
        return fail(f"--data {data}: {e}")
    if fp["vocab_size"] != vocab:
        return fail(f"--data {data} has a {fp['vocab_size']}-token vocabulary; the protocol needs {vocab}")
    have = (runner.train_tokens(data) - 1) // seq_len
    if (n := need()) > 2 * have:
        return fail(f"--data {data} holds {have:,} training windows of {seq_len} tokens; {longest} reads {n:,}, more "
                    f"than twice over: give a token folder of at least {(n + 1) // 2 * seq_len + 1:,} training tokens "
                    "(--data)")  # fmt: skip
    return data, fp, have


def _spec_write(ctx, store, st, pre, out: Path, spec_file: str) -> dict:
    """results.json and report.md of a spec-file experiment (each written whole, atomically); returns the results."""
    from growlm.eval.experiments import render, results  # lazy: as in main
    from growlm.runtime.atomic import write_text  # lazy: as in main

    fixed = None if pre is None else {f["what"]: f["value"] for f in pre.get("fixed", [])}
    res = results.summarize(ctx, store, st, fixed, spec_file)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(out / "results.json", res, overwrite=True)
    write_text(out / "report.md", render.markdown(res), overwrite=True)
    return res


def _checked(args, s, out: Path, parallel: int) -> int:
    """``_main_out``, with a curve file that is damaged or made with other settings reported as bad input (2)."""
    from growlm.eval.experiments import runner  # lazy: as in main

    try:
        return _main_out(args, s, out, parallel)
    except (runner.SettingsMismatch, runner.CurveFileError) as e:
        return fail(str(e))


def _main_out(args, s, out: Path, parallel: int) -> int:
    """The report (--report_only), or the data check, the runs and the report, with --out held by this process."""
    from growlm.eval.experiments import plan, report, runner  # lazy: as in main

    if args.phase == "map":
        return _map(args, s, out, parallel)
    if args.phase == "optimal":
        return _optimal(args, s, out, parallel)
    settings = s.as_dict()
    if args.report_only:
        return _report_only(out, settings, lambda done: report.write(s, done, out), "")
    if s.device.startswith("cuda"):
        import torch  # lazy: only the cuda check needs it in this process

        if not torch.cuda.is_available():
            return fail("no CUDA device visible to torch; use --device cpu (or the cpu profile)")
    from growlm.data.tokens import cache_dir  # lazy: only for the data check

    got = _token_folder(args.data, cache_dir() / f"bpe{s.vocab_size}", s.vocab_size, (), s.seq_len,
                        lambda: plan.max_train_windows(s), f"the longest run of the {s.profile} profile")  # fmt: skip
    if isinstance(got, int):
        return got
    data, settings["data"], _ = got
    done = runner.load_curves(out, settings)
    try:
        return _run(s, args, done, data, out, settings, parallel)
    except plan.CurveMismatch as e:
        return fail(str(e))


def _run(s, args, done, data, out, settings, parallel) -> int:
    """Dry run, or the pilot's rounds, the main runs and the report (``plan.CurveMismatch`` propagates)."""
    from growlm.eval.experiments import plan, report, runner  # lazy: as in main

    if args.dry_run:
        specs, st = plan.pilot(s, done)
        return dry_run(s, [sp for sp in specs if sp.name not in done], st, done)
    with runner.Workers(parallel) as workers:
        rnd = 0
        while True:
            specs, st = plan.pilot(s, done)
            todo = [sp for sp in specs if sp.name not in done]
            if not todo:
                break
            rnd += 1
            plan.check_finished(done, specs)
            failed = runner.run_all(s, todo, data, out, settings, workers, f"pilot round {rnd}")
            done = runner.load_curves(out, settings)
            if failed:
                return 1
        if args.phase == "pilot":
            print(f"growlm-experiment: pilot complete ({len(done)} runs in {out / 'curves'})")
            return 0
        main = plan.main_specs(s, st)
        plan.check_finished(done, main)
        failed = runner.run_all(s, main, data, out, settings, workers, "main")
    done = runner.load_curves(out, settings)
    rc = report.write(s, done, out)
    return 1 if failed else rc


def _map(args, s, out: Path, parallel: int) -> int:
    """The crossover map: its report (--report_only), or its data check, its rounds of runs and its report."""
    from growlm.eval.experiments import crossmap, runner  # lazy: as in main

    m = crossmap.quick_map() if args.quick else crossmap.MAP
    m.check(s)
    settings = crossmap.settings_dict(s, m)
    if args.report_only:
        return _report_only(out, settings, lambda done: crossmap.write(s, m, done, out), "--phase map")
    got = _token_folder(args.data, crossmap.token_folder(s, m), s.vocab_size, m.extra, s.seq_len,
                        lambda: crossmap.max_train_windows(s, m), "the map's longest run")  # fmt: skip
    if isinstance(got, int):
        return got
    data, fp, have = got
    settings["data"] = fp | {"train_windows": have}
    done = runner.load_curves(out, settings)
    rc = _rounds(args, s, lambda d: crossmap.map_plan(s, m, d)[0], "map", done, data, out, settings, parallel)
    if rc is not None:
        return rc
    return crossmap.write(s, m, runner.load_curves(out, settings), out)


def _optimal(args, s, out: Path, parallel: int) -> int:
    """The experiment at the map's budget: its report (--report_only), or its data check, its rounds and its
    report. The design is read from the map's map.json; curves made from another design are refused."""
    from growlm.eval.experiments import crossmap, optimal, optimal_report, runner  # lazy: as in main

    m = crossmap.quick_map() if args.quick else crossmap.MAP
    where = args.map or Path("runs/isoflop_map_quick" if args.quick else DEFAULT_MAP_OUT[args.profile])
    if where.is_file():
        return fail(f"--map {where} is a file; give the folder that holds map.json (--map {where.parent})")
    try:
        r = json.loads((where / "map.json").read_text())
    except FileNotFoundError:
        return fail(f"--map {where} has no map.json; run growlm-experiment --phase map (or give its --out as --map)")
    except (OSError, ValueError) as e:
        return fail(f"--map {where}/map.json cannot be read ({e}); rebuild it with --phase map --report_only")
    if r.get("protocol") != crossmap.MAP_PROTOCOL:
        return fail(f"--map {where}/map.json is not a crossover map of {crossmap.MAP_PROTOCOL}; give the folder "
                    "growlm-experiment --phase map wrote")  # fmt: skip
    try:
        s = optimal.design(s, r, args.target, args.budget)
        r_s, r_out = optimal.refine_settings(s), out / optimal.REFINE  # the runs between the ladder's sizes
    except optimal.DesignError as e:
        return fail(str(e))
    settings, note = s.as_dict(), optimal.choice_note(s, r)
    if args.report_only:

        def write(done: dict) -> int:
            refined = runner.load_curves(r_out, r_s.as_dict(), with_data=False)
            return optimal_report.write(s, done, out, note, refined)

        return _report_only(out, settings, write, "--phase optimal")
    data = args.data or crossmap.token_folder(s, m)
    if not (data / "meta.json").is_file():
        return fail(f"--data {data} has no meta.json; the map's token folder is needed (growlm-experiment --phase "
                    "map prepares it)")  # fmt: skip
    have = (runner.train_tokens(data) - 1) // s.seq_len
    settings["data"] = runner.data_fingerprint(data) | {"train_windows": have}
    if have != s.design["train_windows"]:
        return fail(f"--data {data} holds {have:,} training windows; the map ran on {s.design['train_windows']:,}: "
                    "give the map's token folder (--data)")  # fmt: skip
    if (need := optimal.max_train_windows(s)) > 2 * have:
        return fail(f"--data {data} holds {have:,} training windows; the longest run reads {need:,}, more than "
                    "twice over: choose a smaller --budget")  # fmt: skip
    done = runner.load_curves(out, settings)
    rc = _rounds(args, s, lambda d: optimal.experiment_plan(s, d)[0], "optimal", done, data, out, settings, parallel,
                 unit="B")  # fmt: skip
    if rc is not None and not (args.dry_run and rc == 0):
        return rc
    done = runner.load_curves(out, settings)
    _, st = optimal.experiment_plan(s, done)
    if not st.complete:  # a dry run before the levers finish: the refine runs follow them
        return 0
    r_set = r_s.as_dict() | {"data": settings["data"]}
    if args.dry_run:
        print(f"growlm-experiment: then the refine runs (sizes between the ladder's), under {r_out}:")
    elif optimal_report.write(s, done, out, note, runner.load_curves(r_out, r_set)):  # the report before refine
        return 2
    rc = _rounds(args, r_s, lambda d: optimal.refine_plan(s, st, d)[0], "refine", runner.load_curves(r_out, r_set),
                 data, r_out, r_set, parallel, unit="B")  # fmt: skip
    if rc is not None and not (args.dry_run and rc == 0):
        return rc
    refined = runner.load_curves(r_out, r_set)
    if any(sp.name not in refined for sp in optimal.refine_plan(s, st, refined)[0]):  # a dry run: refine first
        return 0
    return 0 if args.dry_run else optimal_report.write(s, done, out, note, refined)


def _report_only(out: Path, settings, write, run: str) -> int:
    """--report_only: ``write(curves)`` over --out's curves (any token folder), or 2 when there are none."""
    from growlm.eval.experiments import runner  # lazy: as in main

    done = runner.load_curves(out, settings, with_data=False)
    if not done:
        return fail(f"no curves under {out / 'curves'}; run growlm-experiment{' ' + run if run else ''} first (or give "
                    "its --out)")  # fmt: skip
    return write(done)


def _rounds(args, s, needed, label: str, done, data, out: Path, settings, parallel: int, unit: str = "C") -> int | None:
    """Run the rounds of a phase whose runs ``needed(done)`` gives from the finished ones, until none is left, or
    list the next round (--dry_run). Returns None when every run has finished, else the exit status (0 after a
    dry run, 1 when a run failed, 2 for a curve of a needed run's name made with another spec)."""
    from growlm.eval.experiments import crossmap, plan, protocol, runner  # lazy: as in main

    try:
        if args.dry_run:
            todo = [sp for sp in dict.fromkeys(needed(done)) if sp.name not in done]
            for sp in todo:
                steps = protocol.run_steps(s, sp)
                print(f"{sp.phase:5s} {sp.name:56s} steps {steps[-1]:6d}  growth at {steps[:-1] or '-'}")
            print(crossmap.eta_line(s, done, todo, parallel, unit))
            return 0
        with runner.Workers(parallel) as workers:
            rnd = 0
            while True:
                specs = needed(done)
                todo = [sp for sp in dict.fromkeys(specs) if sp.name not in done]
                if not todo:
                    return None
                rnd += 1
                plan.check_finished(done, specs)
                name = f"{label} round {rnd}"
                print(f"growlm-experiment: {name}: {crossmap.eta_line(s, done, todo, parallel, unit)}", flush=True)
                failed = runner.run_all(s, todo, data, out, settings, workers, name)
                done = runner.load_curves(out, settings)
                if failed:
                    return 1
    except plan.CurveMismatch as e:
        return fail(str(e))


def dry_run(s, todo, st, done) -> int:
    """Print the runs that would start now (the main runs not yet finished, when the pilot is complete)."""
    from growlm.eval.experiments import plan, protocol  # lazy: as in main

    if st.complete:
        main = plan.main_specs(s, st)
        plan.check_finished(done, main)
        todo = [sp for sp in main if sp.name not in done]
    for sp in todo:
        steps = protocol.run_steps(s, sp)
        print(f"{sp.phase:5s} {sp.name:48s} steps {steps[-1]:6d}  growth at {steps[:-1] or '-'}")
    print(f"{len(todo)} runs, {sum(sp.budget for sp in todo):.2f} C of compute (C = {s.c_flops:.3g} FLOPs)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
