"""The GPU worker controller: wire codec and state machine (pure), container driver, conformance check."""
