"""Developer tools: code generation and command-line helpers."""
