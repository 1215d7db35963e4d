"""growlm-run: the multi-stage driver. One command runs a whole growth plan whose stages declare their own
resources (``resources``): stages on the previous stage's resources grow live inside the running job; at a change of
resources the job stops with a checkpoint (train.py --stop_before_stage), the checkpoint is grown and resharded
offline (growth.offline.pipeline), and train.py is relaunched on the new resources with the DeepSpeed launcher.

Modules: ``cli`` (the command line), ``dry_run`` (what a run would do, printed), ``resources`` (each stage's nodes,
ranks, hostfile), ``segments`` (the plan cut into jobs, their DeepSpeed configs and launcher commands), ``fits_here``
(the jobs on this machine checked against its GPUs and memory), ``phases`` (train -> save -> grow -> relaunch with a
crash-safe progress file). Its children die with it (runtime.processes). DESIGN.md, "Multi-stage driver", describes the
phases and the crash safety.
"""

from growlm.trainer.driver.cli import main

__all__ = ["main"]
