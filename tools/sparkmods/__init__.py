"""sparkmods: keep vLLM performance mods for DGX Spark applying across vLLM releases."""

__version__ = "0.2.0"
