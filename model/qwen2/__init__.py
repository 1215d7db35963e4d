"""The Qwen 2 family: ``config`` (Qwen2Config, presets), ``model`` (Qwen2, transformers' Qwen2ForCausalLM names),
``hf`` (conversion both ways). A Llama shape with q/k/v biases. Registered in model.registry."""
