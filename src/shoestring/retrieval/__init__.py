"""Retrieval over the user's own corpus, and retrieval-augmented generation (docs/retrieval.md).

One module per job: ``passages`` (documents → word windows with source and offset),
``lexical`` (BM25 via ``bm25s``), ``dense`` (an encoder's pooled embeddings in a ``faiss``
exact inner-product index), ``fusion`` (reciprocal-rank fusion), ``index`` (build, manifest,
incremental rebuild, search), ``prompt`` (the RAG prompt within the decoder's context) and
``ask`` (retrieve → prompt → generate).
"""
