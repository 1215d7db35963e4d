"""The DeepSpeed runtime growlm needs with or without growth.

``dist`` (accelerator choice, MPI discovery, process group, close), ``engine`` (building the DeepSpeed engine for a
GPT, optimizer read-outs), ``checkpoint`` (save, open and load a checkpoint: tags, RNG, compatibility checks),
``manifest`` (sha256 of every checkpoint file), ``run_state`` (``RunState``, the typed ``growlm_state.json``),
``atomic`` (the write-to-temp-then-rename helpers) and ``launch`` (starting N local ranks, a free port).
Nothing here imports deepspeed at module level: ``dist.select_accelerator`` must run first.
"""
