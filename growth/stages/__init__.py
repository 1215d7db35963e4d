"""The growth plan: ``plan`` (the YAML plan file: the start shape and the stages, StageList, load_stages) and
``trigger`` (when a stage fires: step, tokens, or the log-log slope of the validation loss)."""
