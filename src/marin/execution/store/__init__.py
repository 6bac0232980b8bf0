"""The store layer: the location (fsspec), prefix policy, the storage probe, records, leases."""
