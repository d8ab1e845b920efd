"""Serving: trained models behind an HTTP API with token-budget batching (docs/serving.md).

``batcher`` gathers inputs into batches of at most ``--max-batch-tokens`` padded tokens on a
worker thread for the engine (`shoestring.inference`, which loads a run dir, an export or a
classifier and runs batches), ``routing`` picks the loaded model version a request's ``model``
names (through the model repository, `shoestring.model_repository`), ``streaming`` carries
generated tokens out as server-sent events, ``app`` is the FastAPI app, ``page`` the HTML page
at ``/``, ``server`` runs it under uvicorn (one process or ``--workers N``), ``metrics`` keeps
the Prometheus numbers (prometheus-client), ``security`` holds the API key check and the limits
that refuse work (413/429), ``settings`` the validated limits.
"""
