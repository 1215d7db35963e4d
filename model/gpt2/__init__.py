"""The GPT-2 family: ``config`` (GPTConfig, presets), ``model`` (GPT, transformers' GPT2LMHeadModel names), ``hf``
(conversion both ways). Registered in model.registry."""
