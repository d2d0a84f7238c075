"""``tokenmill serve``: an OpenAI-compatible Files/Batches API, tokenmill's job routes, Prometheus
metrics and a dashboard, in front of the Celery fleet (or of an embedded runner without a broker).

Storage goes through ``connectors``; jobs through ``jobs`` (specs) and ``pipeline`` (fleet).
"""
