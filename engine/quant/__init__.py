"""Quantized checkpoints: which ones run (``scheme.py``), their tensors decoded (``checkpoint.py``),
the products that run on them (``linear.py`` on the CPU, ``fp8_linear.py`` on CUDA) and the
model's linears swapped for those (``apply.py``)."""
