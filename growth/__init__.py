"""Growth operators on the whole training state (weights, Adam moments, LR schedule, masks, data position, RNG).

Operators as data: ``plan`` (Rule, RuleSet: per-parameter maps), ``ops/`` (masked and duplication families,
torch only), ``apply`` (runs a plan between two stores with an Adam-state policy), ``stores`` (the ParamStore
interface, in-memory stores). One preparation for every growth path: ``prepare`` (checks, masks, LR placement).
Live growth: ``live`` (EngineStore, ``grow_engine``). Offline growth (the growlm-grow command): ``offline`` (the
grow/reshard pipeline), ``universal`` (universal-checkpoint files, UniversalStore), ``export`` (transformers
folder), ``grow_checkpoint`` (command line). When and how: ``stages`` (the YAML stage list, StageList),
``schedule`` (the LR schedule: DeepSpeed's WarmupCosineLR arithmetic, its start, placement and re-warm),
``trigger`` (the log-log slope trigger), ``scaling`` (the scaling-law growth advisor). Single process:
``state`` (TrainingState, ``grow_state``), ``single_process`` (TrainingState <-> model + torch AdamW + scheduler).
The DeepSpeed runtime itself (process group, engine, checkpoints, manifests) is in ``runtime/``.
"""
