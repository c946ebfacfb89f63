"""The serving layer: engine, drafters, models, server and workers (DESIGN.md). Importing the package loads
nothing heavy: torch comes with its modules."""


def package_version() -> str:
    """'specfinops 0.1.0' as installed (a wheel, or `make install`'s editable install); 'specfinops (source)'
    where run from a checkout that was never installed."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return f"specfinops {version('specfinops')}"
    except PackageNotFoundError:
        return "specfinops (source)"
