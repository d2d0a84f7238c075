"""Why a model cannot be loaded, as types: the CLI turns each into one line and its own exit code.

They subclass ``ValueError`` because that is what these failures raised before they had types.
"""

from __future__ import annotations


class ModelError(ValueError):
    """A model that cannot be found or run; the message is one line for the user."""


class ModelNotFound(ModelError):
    """No packaged model, local folder or Hub snapshot by that name (or not in the cache offline)."""


class UnsupportedArchitecture(ModelError):
    """The checkpoint's architectures are none of those the engine runs."""


class UnsupportedQuantization(ModelError):
    """The checkpoint's weights are quantized with a method the engine does not run."""
