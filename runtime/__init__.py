"""The DeepSpeed runtime growlm needs with or without growth.

``dist`` (accelerator choice, MPI discovery, process group, close), ``engine`` (building the DeepSpeed engine for a GPT,
optimizer read-outs), ``schedule`` (DeepSpeed's WarmupCosineLR arithmetic, its start and re-warm), ``checkpoint`` (save,
open and load a checkpoint: tags, safe unpickling), ``checkpoint_shares`` (which rank hashes and
checks which of its files), ``resume_checks`` (a checkpoint against the run that resumes it), ``rng`` (a process's RNG
states, saved and restored), ``manifest`` (sha256 of every checkpoint file), ``run_state`` (``RunState``, the typed
``growlm_state.json``), ``metrics_file`` (metrics.jsonl, its writer and reader), ``lock`` (one writer per run folder),
``atomic`` (the write-to-temp-then-rename helpers), ``launch`` (starting N local ranks, a free port), ``processes``
(process groups: start, kill, wait, die with a driver), ``commands`` (what every command line shares), ``quiet`` (known
third-party noise, filtered once) and ``crash_points`` (test-only hold points). Nothing here imports deepspeed at module
level: ``dist.select_accelerator`` must run first.
"""
