"""The relay's names on a host and its frame format on the wire, defined ONCE.

Standard library only, and only `struct`: every relay command on a host imports this at
its start (`remote.relay.host`), and `remote.protocol` re-exports these same objects for
everything else. Kept apart from `remote.protocol` because that one's dataclasses and
typing cost each short host-side command about 15 ms of its start.
"""

from __future__ import annotations

import struct

MANIFEST = ".dflash-manifest.json"  # beside a published checkpoint's files, per file sha256
PARTIAL_PREFIX = ".partial-"  # <drafters>/.partial-<name>/: a checkpoint still arriving
REPAIR_PREFIX = ".dflash-repair-"
FRAME_HEADER = struct.Struct(">Q")  # the length of the payload that follows
# Seconds a host-side relay command waits on the controller with no sign of life (a
# request, a ping, a frame's bytes) before it ends, dropping its lock: a controller that
# vanished without closing its connection leaves no lock held. The controller gives up on
# a stalled stream after half of this, and pings an idle lock holder well within it.
PATIENCE = 240.0
