"""doit's plugin lookup answered once per group within :func:`plugins_looked_up_once`
(the edit loop's repeated runs), and the hook it replaces is still doit's."""

from __future__ import annotations

from doit import plugin as doit_plugin
from doit.plugin import PluginDict

from metrale_orch.tasks.doit_api import plugins_looked_up_once


def test_each_group_is_looked_up_once_within_the_block() -> None:
    original = doit_plugin.entry_points_impl
    assert callable(original), "doit changed: doit.plugin has no entry_points_impl"
    with plugins_looked_up_once():
        lookup = doit_plugin.entry_points_impl()
        first = lookup(group="doit.COMMAND")
        assert lookup(group="doit.COMMAND") is first
        plugins = PluginDict()
        plugins.add_plugins({}, "COMMAND")  # doit's own caller takes the memo's answer
    assert doit_plugin.entry_points_impl is original
