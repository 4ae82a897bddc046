"""The GPU worker's wire (docs/worker-wire.md): its JSON-lines messages (`codec.py`), the controller's state
machine that drives a worker (`controller.py`), and the record a worker leaves (`record.py`)."""
