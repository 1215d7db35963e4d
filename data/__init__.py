"""growlm data: the GPT-2 tokenizer and the one tokenizer policy (data.tokenizer), the one reader of user text files
(data.text), the built-in corpus (data/corpus, rebuilt by data.build_corpus), token folders and growlm's cache folder
(data.tokens), and their preparation (data.prepare: growlm-prepare; data.small_vocab: a BPE of the built-in
corpus)."""
