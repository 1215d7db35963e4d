"""The error an evaluation raises for bad input (model, eval set or window sizes)."""


class EvalInputError(ValueError):
    """Bad input to an evaluation (model, eval file or window sizes); the message names the fix.

    Problems inside a user's eval file are ``data.text.InputError`` (``FILE:LINE: problem; fix``) and a tokenizer
    that cannot be loaded is ``data.tokenizer.TokenizerError``; growlm-eval reports all three the same way (exit
    status 2, one line).
    """
