"""ctxkit's version, in one place below every package that records it (run manifests, the
server's OpenAPI document); ``ctxkit.__version__`` re-exports it. Keep it equal to
``project.version`` in pyproject.toml (tests/test_architecture.py checks)."""

__version__ = "0.1.0"
