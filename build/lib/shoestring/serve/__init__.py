"""Serving: a trained model behind an HTTP API with dynamic micro-batching (docs/serving.md).

``batcher`` gathers requests into batches on a worker thread, ``engine`` loads a run dir, an
export or a classifier and runs batches, ``app`` is the FastAPI app, ``server`` runs it under
uvicorn, ``metrics`` writes Prometheus text, ``security`` holds the API key check and body
limit, ``settings`` the validated limits.
"""
