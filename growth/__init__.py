"""Growth of the whole training state (weights, Adam moments, LR schedule, masks, data position, RNG), by job:

``ops/``      the operators as data: ``rules`` (Rule, RuleSet: per-parameter maps), the masked and duplication
              families (``masked``, ``width``, ``depth``; ``make_rules`` chains them), ``apply`` (a RuleSet between two
              stores with an Adam-state policy), ``stores`` (the ParamStore interface), ``preparation`` (the one
              growth preparation: checks, masks, LR placement), ``schedule_rule`` (where the LR schedule continues),
              ``single_process`` (TrainingState, ``grow_state``, model + AdamW conversion). Torch only: no rank,
              engine or file.
``stages/``   the YAML growth plan (``plan``: StageList, Stage, load_stages) and its triggers (``trigger``).
``live/``     growth inside a running DeepSpeed job: ``engine`` (``grow_engine``), ``transfer`` (EngineStore, the
              bucketed transfer), ``shards`` (each rank's fragments).
``offline/``  growth of a saved checkpoint (growlm-grow): ``shards`` (the native ZeRO shard reader), ``universal``
              (the universal-checkpoint writer), ``pipeline`` (grow and reshard), ``weights`` (a checkpoint's fp32
              weights), ``export`` (transformers folder), ``cli`` (the command line).
``errors``    GrowthError, the one error type of growth.
The DeepSpeed runtime itself (process group, engine, checkpoints, LR schedule) is ``runtime``.
"""
