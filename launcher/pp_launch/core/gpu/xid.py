"""NVIDIA Xid errors: what each critical one means, and which fail the stage on that GPU (docs/recovery.md). Pure.

The meanings are NVIDIA's (the Xid catalogue in the GPU deployment and management documentation). A fatal Xid
fails the stage whose GPU reported it, and the run's next attempt never places on that GPU again; the others are
said, and the stage runs on (they are usually the application's own fault, or recovered by the driver).
"""

from __future__ import annotations

MEANINGS = {
    13: "graphics engine exception (usually the application's own fault)",
    31: "GPU memory page fault (usually the application's own fault)",
    43: "GPU stopped processing (the application hit an error)",
    45: "preemptive cleanup, after an earlier error",
    48: "double-bit ECC error: uncorrectable memory error",
    61: "internal micro-controller breakpoint or warning",
    62: "internal micro-controller halt",
    63: "ECC page retirement or row remapping recorded: the GPU needs a reset",
    64: "ECC page retirement or row remapping failed",
    74: "NVLink error",
    79: "GPU has fallen off the bus",
    92: "high single-bit ECC error rate",
    94: "contained ECC error: the application using the memory is affected",
    95: "uncontained ECC error: every application on the GPU is affected, the GPU needs a reset",
    119: "GSP RPC timeout",
    120: "GSP error",
}

FATAL = frozenset({48, 62, 63, 64, 74, 79, 94, 95, 119, 120})


def meaning(xid: int) -> str:
    return MEANINGS.get(xid, "see NVIDIA's Xid catalogue")


def fails_stage(xid: int) -> bool:
    return xid in FATAL


def describe(xid: int) -> str:
    """`Xid 79 (GPU has fallen off the bus)`."""
    return f"Xid {xid} ({meaning(xid)})"
