"""The compatibility matrix: every mod on every vLLM release, as JSON, Markdown and SVG."""
