"""A run's GPUs watched through NVML events while its stages run (docs/recovery.md): the only place, beside
adapters/nvml.py, that speaks NVML. One thread, owned here and joined by `stop()`, waits on an NVML event set
registered for critical Xid errors on each of the run's GPUs (`nvmlDeviceRegisterEvents`, `nvmlEventSetWait`) and
calls `on_xid(uuid, index, xid)` for each; the caller decides what an Xid means for its stages (core/gpu/xid.py).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import Any

from pp_launch.adapters import nvml as nvml_reader
from pp_launch.adapters.runtime import Nursery

XID_CRITICAL = 0x8  # nvmlEventTypeXidCriticalError
WAIT_MS = 200  # each wait; stop() is seen within this


class GpuWatch:
    def __init__(self, uuids: Iterable[str], on_xid: Callable[[str, int, int], None]) -> None:
        self.uuids = tuple(dict.fromkeys(uuids))
        self.on_xid = on_xid
        self.note = ""  # why some or all of the GPUs are not watched ("" when every one is)
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._threads = Nursery("the GPUs' Xid watch")

    def start(self) -> GpuWatch:
        """Begin watching (returns once the event set is registered, or watching proved impossible: `note`)."""
        if self.uuids:
            self._threads.start(self._run, name="gpu-watch")
            self._ready.wait(10)
        return self

    def stop(self) -> None:
        self._stop.set()
        self._threads.join(5.0)  # a wait on the event set is bounded (its timeout)

    def _run(self) -> None:
        try:
            nvml = nvml_reader.load_module()
            nvml.nvmlInit()
        except Exception as exc:  # no driver, no library: nothing to watch, said once by the caller
            self.note = f"the GPUs are not watched for Xid errors: {exc}"
            self._ready.set()
            return
        try:
            self._watch(nvml)
        finally:
            _quietly(nvml.nvmlShutdown)

    def _watch(self, nvml: Any) -> None:
        events = nvml.nvmlEventSetCreate()
        try:
            handles = self._register(nvml, events)
            self._ready.set()
            while handles and not self._stop.is_set():
                try:
                    data = nvml.nvmlEventSetWait(events, WAIT_MS)
                except nvml.NVMLError_Timeout:
                    continue
                except nvml.NVMLError as exc:
                    self.note = f"watching the GPUs for Xid errors stopped: {exc}"
                    return
                uuid = _text(_quietly(nvml.nvmlDeviceGetUUID, data.device) or "?")
                index = _quietly(nvml.nvmlDeviceGetIndex, data.device)
                self.on_xid(uuid, -1 if index is None else int(index), int(data.eventData))
        finally:
            self._ready.set()
            _quietly(nvml.nvmlEventSetFree, events)

    def _register(self, nvml: Any, events: Any) -> list[Any]:
        handles, missing = [], []
        for uuid in self.uuids:
            try:
                handle = nvml.nvmlDeviceGetHandleByUUID(uuid)
                if _quietly(nvml.nvmlDeviceIsMigDeviceHandle, handle):  # events are the whole GPU's
                    handle = nvml.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(handle)
                nvml.nvmlDeviceRegisterEvents(handle, XID_CRITICAL, events)
                handles.append(handle)
            except nvml.NVMLError as exc:
                missing.append(f"{uuid} ({exc})")
        if missing:
            self.note = f"not watched for Xid errors: {', '.join(missing)}"
        return handles


def _quietly(fn: Callable[..., Any], *args: Any) -> Any:
    try:
        return fn(*args)
    except Exception:  # a GPU that is gone answers nothing: unknown, never a crash of the watch
        return None


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
