"""kvhoard: a storage engine for the KV caches of large language models.

``kvhoard.Store`` opens a volume in this process; ``kvhoard.lmcache`` holds LMCache's plugins.
"""

from kvhoard._native import KvhoardError, Store

__all__ = ["KvhoardError", "Store"]
