"""The engine that runs a trained model (``engine``), times its stages (``stages``) and streams
its tokens (``tokens``). It knows no HTTP: ``serve`` puts it behind an API and ``retrieval``
embeds passages with it, so neither imports the other to reach it."""
