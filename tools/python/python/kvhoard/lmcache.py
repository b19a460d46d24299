"""LMCache plugins backed by a kvhoard volume.

``NativePlugin`` is the connector LMCache's multiprocess ``native_plugin`` L2 adapter loads::

    lmcache server ... --l2-adapter '{"type": "native_plugin",
        "module_path": "kvhoard.lmcache", "class_name": "NativePlugin",
        "adapter_params": {"path": "/data/kv", "create": true}}'

Parameters: ``path``, ``create`` (create the volume if missing), ``capacity`` (bytes),
``namespace`` ("lmcache"), ``durability`` ("written"), ``ttl`` (seconds), ``dram_tier`` (bytes),
``threads`` (4). See docs/lmcache.md.
"""

from kvhoard._native import NativePlugin

__all__ = ["NativePlugin"]
