"""``metrale-orch watch``: the warm edit loop on the build graph that doit builds.

- :mod:`~metrale_orch.watch.changes`: what really changed, by content (the file table);
- :mod:`~metrale_orch.watch.watcher`: the file watcher, a coroutine on an event loop;
- :mod:`~metrale_orch.watch.cycle`: which targets a change reaches and what a cycle did
  (pure);
- :mod:`~metrale_orch.watch.loop`: the loop itself, each cycle one in-process doit run.

Imports nothing of the CLI; only the CLI prints what it returns.
"""
