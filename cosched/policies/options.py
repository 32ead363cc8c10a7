"""A plugin's options in its name: `alias:VALUE` or `alias:key=value,key=value`.

Why its own module: the registry passes one argument string after the alias's colon, and
every policy that takes several numbers (`sa`, `nsa`, `fairshare`) reads it the same way,
so a misspelt key is refused with the same one-line error everywhere.
"""

from __future__ import annotations

from cosched.errors import ConfigError


def parse_options(argument: str | None, allowed: dict[str, type], first: str) -> dict[str, object]:
    """`VALUE` (for the option named `first`) or `key=value,key=value`, checked against
    `allowed`: so `sa:1000` and `sa:iterations=1000,period=30` both read."""
    if not argument:
        return {}
    options: dict[str, object] = {}
    for part in argument.split(","):
        key, eq, value = part.partition("=")
        if not eq:
            key, value = first, part
        key = key.strip()
        if key not in allowed:
            raise ConfigError(f"unknown option {key!r} in {argument!r}; known: {', '.join(allowed)}")
        try:
            options[key] = allowed[key](value.strip())
        except ValueError:
            raise ConfigError(f"option {key}={value!r} is not a {allowed[key].__name__}") from None
    return options
