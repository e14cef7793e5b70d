"""gpubook's command-line client. It depends only on the public REST API, never on the server's code."""

__version__ = "0.1.0"
