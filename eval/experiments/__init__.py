"""Experiments: the staged-training experiment (growlm-experiment, eval.experiments.staged) and its report."""
