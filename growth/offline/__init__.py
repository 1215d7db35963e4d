"""Growth of a saved checkpoint (growlm-grow): ``shards`` (the native ZeRO shard reader), ``universal`` (the
universal-checkpoint files and their writer), ``pipeline`` (grow or reshard in one pass), ``weights`` (a checkpoint's
fp32 weights, for export, growlm-eval and tests), ``export`` (the transformers folder), ``cli`` (the command line)."""
