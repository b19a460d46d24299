"""LMCache plugins backed by a kvhoard volume.

``NativePlugin`` is the connector LMCache's multiprocess ``native_plugin`` L2 adapter loads::

    lmcache server ... --l2-adapter '{"type": "native_plugin",
        "module_path": "kvhoard.lmcache", "class_name": "NativePlugin",
        "adapter_params": {"path": "/data/kv", "create": true}}'

Parameters: ``path``, ``create`` (create the volume if missing), ``capacity`` (bytes),
``namespace`` ("lmcache"), ``durability`` ("written"), ``ttl`` (seconds), ``dram_tier`` (bytes),
``threads`` (4 batches at once), ``io_depth`` (keys of a get batch read at once; all by default). See
docs/lmcache.md.

``StorageBackend`` is a classic-stack ``storage_plugins`` backend (a vLLM worker's LMCache
engine stores and loads chunks on a kvhoard volume in-process); its settings are
``extra_config`` keys ``kvhoard.path``, ``kvhoard.capacity``, ... (see docs/lmcache.md).
"""

from kvhoard._native import NativePlugin

__all__ = ["NativePlugin", "StorageBackend"]


def __getattr__(name):
    # The storage plugin imports LMCache and torch; the native plugin needs neither.
    if name == "StorageBackend":
        from kvhoard._storage_backend import StorageBackend

        return StorageBackend
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
