"""pp-launch for tests: the fake NVIDIA host (NVML library, container toolkit hook, CDI) and helpers.

Nothing here is imported by the launcher itself; it is for test suites, ours and our users'.
"""
