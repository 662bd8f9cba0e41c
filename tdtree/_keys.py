"""Key handling, in one place: what a key is and how it is spelled.

A key is a ``str``; a nested key is a non-empty tuple of ``str``. ``"a"`` and
``("a",)`` name the same entry everywhere.
"""

from __future__ import annotations

from typing import Union

NestedKey = Union[str, tuple[str, ...]]

__all__ = ["NestedKey", "as_path", "is_key", "display"]


def as_path(key: object) -> tuple[str, ...]:
    """Return ``key`` as a non-empty tuple of str; raise TypeError naming the bad part."""
    if type(key) is str:
        return (key,)
    if type(key) is tuple and key:
        for part in key:
            if type(part) is not str:
                raise TypeError(
                    f"key {key!r}: every part of a nested key must be a str, got {type(part).__name__} {part!r}"
                )
        return key
    if type(key) is tuple:
        raise TypeError("the empty tuple is not a key: a nested key names at least one entry")
    raise TypeError(f"keys are str or tuples of str, got {type(key).__name__} {key!r}")


def is_key(obj: object) -> bool:
    """True when ``obj`` is spelled like a key (a str, or a non-empty tuple of str)."""
    if type(obj) is str:
        return True
    return type(obj) is tuple and len(obj) > 0 and all(type(p) is str for p in obj)


def display(path: tuple[str, ...]) -> NestedKey:
    """The public spelling of a path: a str at the top level, a tuple below it."""
    return path[0] if len(path) == 1 else path
