"""The one error type of growth/: bad growth input, raised before any state is touched."""


class GrowthError(ValueError):
    """A growth request that cannot be carried out. The message names the value seen, the value expected and the fix."""
