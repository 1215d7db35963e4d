"""Growth operators on the whole training state (weights, Adam moments, schedule, masks, data position, RNG).

Layout: ``plan`` (Rule, GrowthPlan: an operator as per-parameter data), ``ops/`` (operator families, torch only),
``apply`` (runs a plan between two stores), ``stores`` (where tensors live), ``state`` (TrainingState and
``grow_state``), ``schedule`` (LR placement, re-warm, slope trigger), ``plan_file`` (YAML growth plans),
``single_process`` (TrainingState <-> model + torch AdamW + DeepSpeed WarmupCosineLR), ``bench_ops`` (cost per
operator), ``testing`` (helpers for tests). ``ds_runtime`` and ``ds_checkpoint`` are the DeepSpeed adapters of the
training loop (they import deepspeed lazily).
"""
