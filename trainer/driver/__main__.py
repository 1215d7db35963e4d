"""``python -m growlm.trainer.driver PLAN.yaml [--dry_run] -- TRAIN_ARGS``: growlm-run without the console script."""

import sys

from growlm.trainer.driver import main

sys.exit(main())
