"""The ``tokenmill`` command line: the top floor, the one package that may import every other
(engine/ and connectors/ < pipeline/ < jobs/ < service/ and harness/ < cli/; tests/system/test_floors.py).

``cli.app:app`` is the console script; ``python -m cli`` runs it too.
"""
