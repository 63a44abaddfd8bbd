"""specreg: a governance and deployment registry for speculative-decoding model pairs.

``specreg.Registry`` is the Python API; the CLI is a thin layer over it. Heavy libraries
(torch, transformers, mlflow) are imported only where they are needed.
"""

__version__ = "0.1.0"


def __getattr__(name):
    # Lazy: `import specreg` must stay cheap for `specreg --help`.
    if name == "Registry":
        from specreg.api import Registry

        return Registry
    raise AttributeError(name)
