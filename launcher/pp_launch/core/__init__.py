"""The pure rules (docs/architecture.md): a chain's plan, course and teardown, GPU choice, the announcement
grammar, labels, events, the worker wire. No I/O here at all: clocks, threads and the engine come through ports."""
