"""tokenmill as an lm-evaluation-harness backend.

``harness.model`` holds the ``tokenmill`` model (``lm_eval --model tokenmill``); importing it
registers the model with the harness. Nothing here is imported by the engine or the service:
lm-eval is the optional ``eval`` extra.
"""
