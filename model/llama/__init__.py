"""The Llama family: ``config`` (LlamaConfig, presets), ``model`` (Llama, transformers' LlamaForCausalLM names),
``hf`` (conversion both ways, and the parts of it Llama-shaped families share). Registered in model.registry."""
