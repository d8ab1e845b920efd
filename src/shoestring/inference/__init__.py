"""Running a trained model outside training: the engine the server, retrieval and the benchmarks
share.

``engine`` loads a run dir, an export or a classifier folder and runs batches of token ids
(tokenize, admit, pad, one forward pass, results as plain Python or NumPy); ``stages`` times
that work per stage; ``tokens`` turns generated tokens into text for a stream. Nothing here
knows HTTP: ``serve`` puts the engine behind an API and ``retrieval`` embeds passages with it,
so neither of them imports the other to reach it.
"""
