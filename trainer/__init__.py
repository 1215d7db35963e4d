"""The training loop behind train.py, one job per module:

cli.py            the growlm-train command line (its parser, ``main``; train.py runs it on every rank)
config.py         the run configuration, validated before any rank talks to another (RunConfig)
plan_checks.py    the growth plan (--growth_plan) judged against the run before launch
errors.py         UsageError / RankError: bad input, one message, exit status 2
loop.py           the training step: micro batches, gradient accumulation, optimizer step, fixed-batch loss
evaluation.py     periodic validation and the before/after sliding-window perplexity
scoring.py        the token scorer (token_nll, NLL, EvalStopped) and its token-id checks, shared with growlm-eval
checkpointing.py  save/restore of the whole run through runtime.checkpoint and RunState
init_from.py      --init_from: a transformers GPT-2 or Llama folder checked, then loaded into the fresh engine's masters
growth_events.py  the growth trigger, the live growth (growth.live.grow.grow_engine) and its record
logger.py         the one logger of metrics.jsonl, TensorBoard and the console
driver/           growlm-run: a plan whose stages run on their own resources (above the rest of trainer)
run.py            wires them: validate, build, train, close (``run(args)``)

Importing the package selects DeepSpeed's accelerator (runtime.dist.select_accelerator), which must happen before
deepspeed is first imported.
"""

from growlm.runtime.dist import select_accelerator

select_accelerator()
