"""Quantized checkpoints on the CPU: which ones run (``scheme.py``), their tensors decoded
(``checkpoint.py``), the products that run on them (``linear.py``) and the model's linears
swapped for those (``apply.py``)."""
