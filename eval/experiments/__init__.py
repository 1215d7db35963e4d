"""Experiments (growlm-experiment, eval.experiments.cli): the equal-compute protocol (equal_compute, its
arithmetic compute_protocol, its report), the older equal-steps protocol (staged), and their reports. Commands: they
launch train.py and sit above trainer."""
