"""The OpenAI-compatible server: ``python -m miniengine serve`` (miniengine/README.md, "Serving over HTTP").

protocol.py (the request body, checked) -> app.py (the routes) -> async_engine.py (one engine loop in a thread)
-> the ``LLM``; choices.py turns outputs into response choices and stream chunks, prometheus.py keeps /metrics,
launch.py makes the flags.  FastAPI and uvicorn are the ``serve`` extra: import this package only to serve.
"""
