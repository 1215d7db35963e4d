"""Growth operators on the whole training state (weights, Adam moments, schedule, masks, data position, RNG).

Operators as data: ``plan`` (Rule, GrowthPlan: per-parameter maps), ``ops/`` (masked and duplication families,
torch only), ``apply`` (runs a plan between two stores with an Adam-state policy), ``stores`` (the ParamStore
interface, in-memory stores). Training state: ``state`` (TrainingState, ``grow_state``), ``single_process``
(TrainingState <-> model + torch AdamW + DeepSpeed WarmupCosineLR), ``schedule`` (LR placement, re-warm, slope
trigger), ``planner`` (Kaplan-form fits, when to grow), ``plan_file`` (YAML growth plans). DeepSpeed adapters:
``ds_runtime`` (process group), ``ds_checkpoint`` (atomic checkpoints with growlm's state), ``manifest`` (checkpoint
checksums), ``live`` (growing a live engine), ``universal`` and ``grow_checkpoint`` (growing and resharding saved
checkpoints, the growlm-grow command).
"""
