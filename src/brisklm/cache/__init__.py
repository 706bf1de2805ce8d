"""KV caches and the bookkeeping of which request owns which part of them."""

from brisklm.cache.contiguous import KVCache
from brisklm.cache.slots import SlotAllocator

__all__ = ["KVCache", "SlotAllocator"]
