"""growlm data: the GPT-2 tokenizer (data.tokenizer), the built-in corpus (data/corpus, rebuilt by
data.build_corpus) and token files for training (data.prepare, console entry growlm-prepare)."""
