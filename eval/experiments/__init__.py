"""Experiments (growlm-experiment, eval.experiments.cli): the IsoFLOP-envelope protocol (protocol: sizes, arms,
settings; plan: which runs the pilot and the main phase need; train_run: one run in process with growlm's model and
growth operators; runner: workers and curve files; analysis: envelope, interpolation, intervals; report and
report_plots). Commands: they sit above growth and trainer."""
