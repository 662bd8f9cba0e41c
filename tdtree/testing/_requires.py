"""hypothesis, which the strategies and laws need, or an ImportError that says how to install it."""

try:
    import hypothesis as hypothesis
except ModuleNotFoundError as error:
    if error.name != "hypothesis":
        raise
    raise ModuleNotFoundError(
        "tdtree.testing's strategies and laws need hypothesis: pip install 'tdtree[testing]' "
        "(the assertions and fixtures work without it)",
        name="hypothesis",
    ) from None

__all__ = ["hypothesis"]
