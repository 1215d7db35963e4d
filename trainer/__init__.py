"""The training loop behind train.py: configuration, step loop, evaluation, checkpointing, growth events, metrics."""
