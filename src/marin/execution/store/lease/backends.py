"""Which lease store a prefix gets: the strongest its backend supports."""

from __future__ import annotations

from fsspec.implementations.local import LocalFileSystem
from fsspec.implementations.memory import MemoryFileSystem

from marin.execution.store.lease.gcs_store import GCSLeaseStore
from marin.execution.store.lease.local_store import LocalLeaseStore
from marin.execution.store.lease.memory_store import MemoryLeaseStore
from marin.execution.store.lease.s3_store import S3LeaseStore
from marin.execution.store.lease.store import LeaseStore, _CompareStore
from marin.execution.store.location import Location


def lease_store(location: Location) -> LeaseStore:
    """The strongest lease store this backend supports."""
    fs = location.fs
    if isinstance(fs, LocalFileSystem):
        return LocalLeaseStore(location)
    if isinstance(fs, MemoryFileSystem):
        return MemoryLeaseStore(location)
    if type(fs).__module__.startswith("s3fs") and hasattr(fs, "call_s3"):
        return S3LeaseStore(location)
    if type(fs).__module__.startswith("gcsfs") and hasattr(fs, "call"):
        return GCSLeaseStore(location)
    return _CompareStore(location)
