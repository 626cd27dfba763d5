"""The version of the content-addressed cache's format, kept out of the cache package.

:data:`CACHE_SCHEMA` is part of every action key and object header
(:mod:`metrale_orch.cache.objects` re-exports it as ``SCHEMA``) and of every plan's
signature (:mod:`metrale_orch.steps.plan`): bumping it disowns every cache entry and
makes every target stale. It lives here so that planning (``check``, task generation)
reads it without importing the cache's tiers and their standard-library modules
(sockets, threads, uuids), which only building and the ``cache`` commands need.
"""

from __future__ import annotations

__all__ = ["CACHE_SCHEMA"]

CACHE_SCHEMA = 1
