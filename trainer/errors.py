"""The errors train.py turns into one message and exit status 2."""


class UsageError(Exception):
    """Bad input from the command line; printed as one message, exit status 2."""


class RankError(UsageError):
    """Bad input that only some ranks can see (e.g. ranks disagreeing); printed by every rank."""
