"""GPU selection: the inventory (from NVML or a file), the pure allocator, and the host-wide reservation."""
