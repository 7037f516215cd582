"""postmortem: what went wrong in a crashed, hung or slow PyTorch distributed job."""

__version__ = "0.1.0"


def analyze(path, **options):
    """Analyze a job's log directory; returns the report dict (the JSON report's structure)."""
    from .api import analyze as _analyze

    return _analyze(path, **options)


__all__ = ["analyze", "__version__"]
