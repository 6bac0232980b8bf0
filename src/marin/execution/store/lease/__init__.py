"""A lease: the cross-process, cross-runner lock that makes a build exactly-once.

The lease is a small JSON file beside the output (``<output>.marin/lease.json``) holding the
holder's id (host, pid, thread), a random token and an expiry. Every backend is reached through
one small interface, :class:`LeaseStore`, with four operations: an atomic **create-if-absent**, a
**read** that returns the content with a version, a compare-and-swap **replace** and a
conditional **delete** (both against that version), plus a **lock** that makes a read-check-write
sequence exclusive where the backend can. The stores:

=================  ==========================================  ================================
backend            create-if-absent                            replace / delete / commit
=================  ==========================================  ================================
local disk         ``os.open(O_CREAT | O_EXCL)`` (fails if      under ``flock`` on a guard file
                   present; a reader may meet it empty for a    (``lease.json.guard``): compare,
                   moment: ``torn_create``)                     then rename into place
``memory://``      under a process-wide lock (the store         under the same lock
                   lives in this process)
``s3://`` (s3fs)   ``PutObject`` with ``If-None-Match: *``      ``PutObject`` / ``DeleteObject``
                                                                with ``If-Match: <ETag>``
``gs://`` (gcsfs)  upload with ``ifGenerationMatch=0``          upload / delete with
                                                                ``ifGenerationMatch=<generation>``
anything else      ``pipe_file(mode="create")`` when the        read, compare, write: **not
                   backend supports it, else check-then-write   atomic** (the weaker fallback)
=================  ==========================================  ================================

With the fallback two runners that start a step in the same instant may both build it; each
still writes a complete record, so nothing half-written is ever served, but ``fn`` can run twice.

A lease whose expiry has passed is taken over. On Linux a lease on local disk whose holder
process is gone (same machine, same PID namespace, and that PID is dead or reused) is taken over
at once instead of after the TTL, so a runner killed by SIGKILL or the OOM killer does not stall
the next run. Set ``MARIN_LEASE_CHECK_PID=0`` to rely on the TTL alone.

While a step runs a heartbeat renews its lease. One shared thread renews every lease the process
holds. A holder that cannot renew has lost the lease and must not commit: :meth:`Lease.commit`
re-proves ownership and writes the record under the same lock (local disk, ``memory://``), or
right after a compare-and-swap renewal that extends the expiry by a whole TTL (S3, GCS).

The package, one module per job:

==================  ============================================================================
``settings``        ``$MARIN_LEASE_TTL`` (read once per run), the week cap, the clock skew allowed
``holder``          who holds a lease: ``host:pid:thread``, and a process id (dead-holder test)
``info``            the lease format: ``LeaseInfo.parse`` (untrusted JSON); expired, skewed, garbled
``store``           the ``LeaseStore`` interface, and the generic check-then-write fallback
``local_store``     local disk; ``memory_store``: ``memory://``; ``s3_store``; ``gcs_store``
``backends``        ``lease_store(location)``: the strongest store a backend supports
``core``            ``Lease`` (take, renew, commit, release), the registry of held leases that
                    Ctrl-C releases, ``read_lease`` and ``break_lease`` (``marin unlock``)
``heartbeat``       one daemon thread renewing every lease this process holds
==================  ============================================================================
"""

from marin.execution.store.lease.backends import lease_store
from marin.execution.store.lease.core import (
    Lease,
    break_lease,
    enclosing,
    held_by_enclosing_build,
    read_lease,
    release_all_held,
)
from marin.execution.store.lease.heartbeat import Heartbeat
from marin.execution.store.lease.info import GARBLED, LeaseInfo
from marin.execution.store.lease.local_store import MetadataFolderGone
from marin.execution.store.lease.settings import (
    CHECK_PID_ENV,
    CLOCK_SKEW_S,
    DEFAULT_TTL_S,
    MAX_TTL_S,
    TTL_ENV,
    ttl_from_env,
)
from marin.execution.store.lease.store import LeaseStore

__all__ = [
    "CHECK_PID_ENV",
    "CLOCK_SKEW_S",
    "DEFAULT_TTL_S",
    "GARBLED",
    "MAX_TTL_S",
    "TTL_ENV",
    "Heartbeat",
    "Lease",
    "LeaseInfo",
    "LeaseStore",
    "MetadataFolderGone",
    "break_lease",
    "enclosing",
    "held_by_enclosing_build",
    "lease_store",
    "read_lease",
    "release_all_held",
    "ttl_from_env",
]
