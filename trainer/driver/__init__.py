"""growlm-run: the multi-stage driver. One command runs a whole growth plan whose stages declare their own
resources (growth.resources): stages on the previous stage's resources grow live inside the running job; at a change
of resources the job stops with a checkpoint (train.py --stop_before_stage), the checkpoint is grown and resharded
offline (growth.offline), and train.py is relaunched on the new resources with the DeepSpeed launcher.

Modules: ``cli`` (the command line and the dry run), ``segments`` (the plan cut into jobs, their DeepSpeed configs
and launcher commands), ``memory`` (model-state bytes per rank, ZeRO paper), ``phases`` (train -> save -> grow ->
relaunch with a crash-safe progress file), ``procs`` (children that die with the driver). DESIGN.md, section
"Multi-stage driver", describes the phases and the crash safety.
"""

from __future__ import annotations


def main(argv: list[str] | None = None) -> int:
    """growlm-run (trainer.driver.cli.main; imported here lazily so train.py's ranks can import ``procs`` cheaply)."""
    from trainer.driver.cli import main as cli_main

    return cli_main(argv)
