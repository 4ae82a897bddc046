"""Event names (contract §4), defined once."""

CHAIN_STARTING = "chain_starting"  # ours, beyond the contract: the first stage is about to be requested
STAGE_STARTED = "stage_started"
STAGE_ANNOUNCED = "stage_announced"
ROSTER = "pp_stage_roster"
STAGE_EXITED = "stage_exited"
CHAIN_STOPPED = "chain_stopped"
