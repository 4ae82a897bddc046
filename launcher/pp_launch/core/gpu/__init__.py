"""GPUs as rules: an inventory and its health (`inventory.py`), which GPUs a chain gets (`allocator.py`,
`requests.py`: --gpus and docker's own --gpus values), and what each Xid error means (`xid.py`)."""
