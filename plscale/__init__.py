"""plscale: hands-on labs and a CLI for LLM parallelism, backed by DeepSpeed."""

__version__ = "0.1.0"
