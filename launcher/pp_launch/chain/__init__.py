"""The chain: plan (pure), scope and supervision (pure, driven through a backend port)."""
